"""Checks of a saved loader or sampler state, run before ``load_state_dict`` changes anything.

Each ``load_state_dict`` of :mod:`rlds_cli.loader` checks the whole state first (every field's
type and range, every array's dtype and shape, every generator state on a scratch generator): a
refused state leaves the loader unchanged and raises one :class:`~rlds_cli.errors.LoaderStateError`
naming the field, never a bare ``KeyError`` or an out-of-range value that loops forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_cli.errors import LoaderStateError

__all__ = [
    "check_array",
    "check_bit_generator",
    "check_bool",
    "check_int",
    "check_number",
    "check_shard_fields",
    "check_state",
]

#: Seeds are drawn with this many bits (``rlds_cli.loader.distributed.SEED_BITS``); epochs and
#: counts are int64 in every array they reach.
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
    if not ok or not np.isfinite(value) or value < low:
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
    saved = check_int(state, "view", "Loader", required=False)
    position = getattr(dataset, "log_position", None)
    if saved is not None and position is not None and saved != position:
        raise LoaderStateError(
            f"Loader state was saved on growing dataset {dataset.name!r} as of commit-log byte "
            f"{saved}; this loader reads its view as of byte {position}, whose rows are others "
            "(evictions and commits moved them), so the sampler's state would draw other rows",
            hint="resume on that view (GrowingDataset(path, position=...) while its segments are "
            "kept), or start the sampler afresh on the new view",
        )
    return state


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
