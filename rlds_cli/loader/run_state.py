"""The state of a data-parallel run: its seed, each rank's stream, and the checks of a saved
loader or sampler state.

* **Rank and world size** come from the arguments, else from ``torch.distributed`` when it is
  initialised (``torchrun``), else ``(0, 1)``.
* **The run seed** is the seed given, else ``$RLDS_SEED``, else a fresh one, drawn on rank 0 and
  broadcast when ``torch.distributed`` is initialised (building a loader with ``seed=None`` is
  then a collective call). A fresh seed is logged (logger ``rlds_cli.loader``, INFO).
* **Per-rank streams**: samplers with replacement seed their generator with
  :func:`stream_seed` of ``(seed, rank)``. Epoch samplers share the seed's permutation and take
  disjoint shards of it.

Never imports torch: ``torch.distributed`` is consulted only when torch is already imported.

**Saved states**: each ``load_state_dict`` of :mod:`rlds_cli.loader` checks the whole state
first (every field's type and range, every array's dtype and shape, every generator state on a
scratch generator): a refused state leaves the loader unchanged and raises one
:class:`~rlds_cli.errors.LoaderStateError` naming the field, never a bare ``KeyError`` or an
out-of-range value that loops forever.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import sys
from collections.abc import Mapping, Sequence
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
    """``seed`` as an int from 0 to 2**63 - 1 (what a saved state holds), or a :class:`SeedError`
    naming it (a 64-bit seed trained, then its own checkpoint was refused)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= _INT64_MAX:
        raise SeedError(
            f"seed must be an integer from 0 to 2**63 - 1 or None, got {seed!r}",
            hint="a 64-bit or wider seed: take it modulo 2**63 (seed % 2**63)",
        )
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


#: Seeds are drawn with :data:`SEED_BITS` bits; epochs and counts are int64 in every array they reach.
_INT64_MAX = 2**63 - 1
_MISSING = object()
_HINT = "restore a state saved by state_dict()"


def check_state(state: Any, what: str) -> Mapping[str, Any]:
    """``state`` if it is a mapping (a dict as :meth:`state_dict` returns)."""
    if not isinstance(state, Mapping):
        raise LoaderStateError(f"{what} state must be a dict (from state_dict()), got {type(state).__name__}")
    return state


def _get(state: Mapping[str, Any], key: str, what: str, required: bool) -> Any:
    value = state.get(key, _MISSING)
    if value is _MISSING and required:
        raise LoaderStateError(f"{what} state has no field {key!r}", hint=_HINT)
    return value


def check_int(
    state: Mapping[str, Any],
    key: str,
    what: str,
    *,
    low: int = 0,
    high: int = _INT64_MAX,
    required: bool = True,
    allow_none: bool = False,
) -> int | None:
    """The integer field ``key`` (not a bool, float or string), in ``[low, high]``; ``None``
    when it is absent and not ``required`` (or ``None`` and ``allow_none``)."""
    value = _get(state, key, what, required)
    if value is _MISSING or (value is None and allow_none):
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= value <= high:
        upper = "" if high == _INT64_MAX else f", {high}"
        interval = f"[{low}{upper}]" if upper else f">= {low}"
        raise LoaderStateError(
            f"{what} state field {key!r} must be an integer {'in ' * bool(upper)}{interval}, got {value!r}",
            hint="restore a state saved by state_dict() on this dataset and loader",
        )
    return int(value)


def check_bool(state: Mapping[str, Any], key: str, what: str, *, required: bool = False) -> None:
    """The field ``key`` is a bool (``True``/``False``, numpy's included)."""
    value = _get(state, key, what, required)
    if value is not _MISSING and not isinstance(value, bool | np.bool_):
        raise LoaderStateError(f"{what} state field {key!r} must be True or False, got {value!r}")


def check_number(
    state: Mapping[str, Any], key: str, what: str, *, low: float = 0.0, required: bool = True
) -> None:
    """The field ``key`` is a finite real number >= ``low`` (ints and floats, not bools)."""
    value = _get(state, key, what, required)
    if value is _MISSING:
        return
    ok = not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)
    try:
        ok = ok and math.isfinite(float(value))  # a Python int past float's range too
    except OverflowError:
        ok = False
    if not ok or value < low:
        raise LoaderStateError(f"{what} state field {key!r} must be a finite number >= {low}, got {value!r}")


def check_array(
    state: Mapping[str, Any],
    key: str,
    what: str,
    *,
    kind: str,
    length: int,
    low: float = 0,
    required: bool = True,
) -> None:
    """The field ``key`` is a 1-d array (or list) of ``length`` finite numbers >= ``low`` whose
    dtype kind is in ``kind`` (``"iu"``: integers, ``"iuf"``: any real number)."""
    value = _get(state, key, what, required)
    if value is _MISSING:
        return
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # ragged nested lists
        array = np.asarray(None)
    problem = None
    if array.dtype.kind not in kind:
        problem = f"dtype {array.dtype}"
    elif array.shape != (length,):
        problem = f"shape {array.shape}"
    elif array.size and (not np.isfinite(array).all() or array.min() < low):
        problem = f"a value that is not finite or below {low}"
    if problem is not None:
        kinds = "integers" if "f" not in kind else "numbers"
        raise LoaderStateError(
            f"{what} state field {key!r} must be {length} finite {kinds} >= {low}, got {problem}"
        )


def check_bit_generator(state: Mapping[str, Any], key: str, what: str, rng: np.random.Generator) -> None:
    """The field ``key`` is a state ``rng``'s bit generator accepts: tried on a scratch one of
    the same kind, so ``rng`` itself is untouched when it is refused."""
    value = _get(state, key, what, True)
    scratch = type(rng.bit_generator)()
    try:
        scratch.state = value
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        kind = type(rng.bit_generator).__name__
        raise LoaderStateError(
            f"{what} state field {key!r} is no {kind} generator state ({exc})",
            hint=_HINT,
        ) from None


def check_shard_fields(
    state: Mapping[str, Any], what: str, *, num_steps: bool = True, seed: bool = False
) -> None:
    """Check the fields that say whose a state is: ``num_steps`` (when ``num_steps``), ``seed``
    (required when ``seed``, else an int or ``None`` when present), ``rank``, ``world_size``."""
    if num_steps:
        check_int(state, "num_steps", what, low=1)
    check_int(state, "seed", what, required=seed, allow_none=not seed)
    check_int(state, "rank", what, required=False)
    check_int(state, "world_size", what, low=1, required=False)


def check_loader_state(state: Any, dataset: Any = None) -> Mapping[str, Any]:
    """A :class:`~rlds_cli.loader.Loader` state's own fields (its sampler checks its part), and
    for a growing ``dataset``, that it was saved on the view the loader reads (see
    :func:`view_state`)."""
    state = check_state(state, "Loader")
    if "sampler" not in state:
        raise LoaderStateError("Loader state has no field 'sampler'", hint=_HINT)
    check_shard_fields(state, "Loader", num_steps=False)
    check_int(state, "batches_drawn", "Loader", required=False)
    check_bool(state, "epoch_end_pending", "Loader")
    check_int(state, "pass_left", "Loader", required=False)
    if "settings" in state and not isinstance(state["settings"], Mapping):
        raise LoaderStateError(f"Loader state field 'settings' must be a mapping, got {state['settings']!r}")
    saved = check_int(state, "view", "Loader", required=False)
    if dataset is not None:
        check_view(saved, dataset, "Loader", f"growing dataset {getattr(dataset, 'name', '?')!r}")
    return state


def check_view(saved: Any, dataset: Any, what: str, described: str) -> None:
    """Refuse a state saved on another view of a growing ``dataset`` than the one read now (its
    commit-log byte ``saved``): evictions and commits moved its rows, so the sampler's state would
    draw other rows. Not checked where either side records no position."""
    position = getattr(dataset, "log_position", None)
    if saved is None or position is None or saved == position:
        return
    raise LoaderStateError(
        f"{what} state was saved on a view as of commit-log byte {saved}; this {what} reads "
        f"{described} as of byte {position}, whose rows are others (evictions and commits moved "
        "them, or it is another dataset), so the sampler's state would draw other rows",
        hint="resume on that view (GrowingDataset(path, position=...) while its segments are "
        "kept), or start the sampler afresh on the new view",
    )


def dataset_fingerprint(dataset: Any) -> str | None:
    """What tells a dataset's rows from another's of the same size: a digest of its manifest's
    content digests (a copy pulled elsewhere has the same); for a growing dataset, which records
    none (its rows change with each commit: :func:`check_view` checks its view), its birth: when
    and by which writer it was created (two recorded the same way had the same commit-log
    positions, and each one's state restored into the other); ``None`` where it records neither."""
    manifest = getattr(dataset, "manifest", None)
    digests = getattr(manifest, "content_digest", None)
    if not digests:
        source = getattr(manifest, "source", None)
        writer = source.get("writer") if isinstance(source, dict) else None
        created = getattr(manifest, "created_at", None)
        if not isinstance(writer, dict) or not writer.get("instance") or not created:
            return None
        digests = {"created_at": created, "writer": writer.get("instance")}
    return hashlib.sha256(json.dumps(digests, sort_keys=True, default=str).encode()).hexdigest()[:32]


def sources_fingerprint(names: Sequence[str], datasets: Sequence[Any]) -> str | None:
    """:func:`dataset_fingerprint` of a source of several datasets (a ``MixtureSource``): its
    members' names and identities, in order (a state over ``{sim, real}`` restored into one over
    ``{real, sim}`` drew other rows); ``None`` where a member records none."""
    prints = [dataset_fingerprint(ds) for ds in datasets]
    if any(p is None for p in prints):
        return None
    return hashlib.sha256(json.dumps([list(names), prints]).encode()).hexdigest()[:32]


def check_same_dataset(state: Mapping[str, Any], dataset: Any, what: str) -> None:
    """Refuse a state whose ``dataset`` (:func:`dataset_fingerprint`) is another dataset's than
    ``dataset`` (of the same size: the step count alone let it through). A state without one (an
    older rlds's), or a dataset that records no content digests, is not checked."""
    saved, mine = state.get("dataset"), dataset_fingerprint(dataset)
    if saved is not None and mine is not None and saved != mine:
        raise _other_dataset(what, repr(getattr(dataset, "name", "this one")))


def _other_dataset(what: str, which: str) -> LoaderStateError:
    """The refusal of a ``what`` state saved on another dataset than ``which`` (content digests)."""
    return LoaderStateError(
        f"{what} state was saved on another dataset than {which} (its content digests differ, or "
        "for a growing dataset its creation)",
        hint="restore it on the dataset it was saved from, or start afresh",
    )


def check_settings(
    state: Mapping[str, Any], mine: Mapping[str, Any], name: str, defaults: Mapping[str, Any] | None = None
) -> None:
    """Refuse a state saved with other settings than ``mine`` (a loader's sampler, its options, batch
    size and dataset): restored, it would continue another stream than the one it was saved from.
    A setting absent on one side counts as its ``defaults`` value (an option given at its default
    is the same stream as one not given). A state without ``settings`` (saved by an rlds before
    2026-11-28) is not checked."""
    saved = state.get("settings")
    if not isinstance(saved, Mapping):
        return
    defaults = defaults or {}
    for key in sorted(set(saved) | set(mine)):
        # "dataset", or a mixture's "dataset <source>"
        dataset = key == "dataset" or key.startswith("dataset ")
        if dataset and (saved.get(key) is None or mine.get(key) is None):
            continue  # a dataset that records no content digest (a growing one: its view is checked)
        if saved.get(key, defaults.get(key)) != mine.get(key, defaults.get(key)):
            if dataset:
                which = f"source {key[8:]!r} of {name}" if key != "dataset" else repr(name)
                raise _other_dataset("Loader", which)
            raise LoaderStateError(
                f"Loader state was saved with {key} {_shown(key, saved.get(key))}; this loader has {key} "
                f"{_shown(key, mine.get(key))}: restored, it would continue another stream",
                hint=f"make the loader with the {key} the state was saved with, or start it afresh",
            )


def check_uniform_draws(saved: Any, *, on_device: bool) -> None:
    """Refuse a uniform sampler's state ``saved`` whose indices were drawn where this loader does
    not draw them: on the device (``in_memory="device"``: a torch generator's state) or on the
    host (numpy's): another stream. (Its own check would name a missing field.)"""
    if not isinstance(saved, Mapping):
        return  # the sampler's own check says what is wrong
    how = {True: "on the device (in_memory='device')", False: "on the host"}
    there = True if "torch_generator" in saved else False if "bit_generator" in saved else on_device
    if there != on_device:
        raise LoaderStateError(
            f"Loader state was saved with uniform indices drawn {how[there]}; this loader draws them "
            f"{how[on_device]}: restored, it would continue another stream",
            hint="make the loader with the in_memory the state was saved with, or start it afresh",
        )


def _shown(key: str, value: Any) -> str:
    """A setting's value in a message (sampler options are kept as their reprs already)."""
    if value is None:
        return "not given"
    return value if key.startswith("sampler option") and isinstance(value, str) else repr(value)


def view_state(dataset: Any) -> dict[str, int]:
    """A loader state's ``view`` field: a growing dataset's commit-log position; empty otherwise."""
    position = getattr(dataset, "log_position", None)
    return {} if position is None else {"view": int(position)}


def check_cursor_state(state: Any, what: str, positions: int | None) -> Mapping[str, Any]:
    """An epoch cursor's fields (``torch_data``'s batch sampler and iterable dataset): seed,
    shard, ``batch_size``, ``epoch`` and ``position`` in ``[0, positions]`` (batches of a pass;
    ``None``: an endless pass)."""
    state = check_state(state, what)
    check_shard_fields(state, what, seed=True)
    check_int(state, "batch_size", what, low=1, required=False)
    check_int(state, "epoch", what)
    if positions is None:
        check_int(state, "position", what)
    else:
        check_int(state, "position", what, high=positions)
    return state
