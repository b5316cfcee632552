"""A mixture's weights relative to the sources' sizes, as Octo and OpenVLA write their mixes.

Octo's and OpenVLA's Open X-Embodiment mixes are lists of ``(dataset, weight)`` that
``make_interleaved_dataset(..., balance_weights=True)`` multiplies by each dataset's number of
transitions before normalizing (``sample_weights * dataset_sizes / sum``): a weight of 1 samples a
dataset in proportion to its size, 2 twice that. Here the same reads:

* ``weights="size"``: every source in proportion to its steps (each step equally likely);
* ``weights={"bridge": ("size", 2.0), "fractal": "size"}``: size times a multiplier (``"size"``
  is ``("size", 1.0)``); a source left out weighs 0;
* ``weights=by_size([("fractal", 0.54), ("kuka", 0.83)])`` or ``by_size({"bridge": 2.0})``:
  an Octo-style mix as written (pairs or a mapping), every entry size-relative;
* plain numbers, as before, are shares that do not depend on the sizes. The two kinds do not mix
  in one ``weights`` (a number next to ``"size"`` has no common unit): refused in one line.

Sizes are the sources' steps when the mixture is made; with ``refresh=`` (sources that grow) the
weights follow the sizes of the views in force, batch after batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_cli.errors import MixtureError

SIZE = "size"

#: One entry of ``weights``: a number, ``"size"`` or ``("size", multiplier)``.
Entry = float | str | tuple[str, float]


def by_size(multipliers: Mapping[str, float] | Iterable[tuple[str, float]] | None = None) -> Any:
    """Weights of size times a multiplier per source: ``{name: ("size", m)}`` from a mapping or
    from ``(name, m)`` pairs (an Octo/OpenVLA mix as written); ``None``: ``"size"`` (all sources
    by size alone)."""
    if multipliers is None:
        return SIZE
    pairs = multipliers.items() if isinstance(multipliers, Mapping) else multipliers
    out: dict[str, tuple[str, float]] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise MixtureError(f"by_size takes (name, multiplier) pairs or a mapping, got {pair!r}")
        out[pair[0]] = (SIZE, pair[1])
    return out


def _multiplier(entry: Any) -> float | None:
    """The multiplier of a size-relative entry, ``None`` for anything else (a number, or what
    the usual check of numbers refuses)."""
    if isinstance(entry, str):
        return 1.0 if entry == SIZE else None
    if isinstance(entry, tuple):
        if len(entry) != 2 or entry[0] != SIZE or isinstance(entry[1], bool):
            raise MixtureError(f"a size-relative weight is ('size', multiplier), got {entry!r}")
        try:
            m = float(entry[1])
        except (TypeError, ValueError):
            raise MixtureError(f"the multiplier of {entry!r} is not a number") from None
        if not np.isfinite(m) or m < 0:
            raise MixtureError(f"the multiplier of {entry!r} must be finite and >= 0")
        return m
    return None


def size_multipliers(weights: Any, names: Sequence[str]) -> np.ndarray | None:
    """Per source (in ``names`` order), the multiplier of its size, when ``weights`` is given
    relative to size (``"size"``, or entries ``"size"`` / ``("size", m)``); ``None`` when
    ``weights`` is anything else (numbers, a schedule), left to the usual checks."""
    if callable(weights) and not isinstance(weights, str):
        return None
    if isinstance(weights, str):
        if weights != SIZE:
            raise MixtureError(f"weights given as a string must be 'size', got {weights!r}")
        return np.ones(len(names))
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise MixtureError(f"weights name unknown source(s) {unknown}; sources are {list(names)}")
        entries = [weights.get(n) for n in names]
        given = [(n, e) for n, e in zip(names, entries, strict=True) if e is not None]
    elif isinstance(weights, Sequence):
        given = list(zip(names, weights, strict=False))
        entries = list(weights)
    else:
        return None
    kinds = {n: _multiplier(e) for n, e in given}
    relative = [n for n, m in kinds.items() if m is not None]
    if not relative:
        return None
    plain = [n for n, m in kinds.items() if m is None]
    if plain:
        raise MixtureError(
            f"weights give source(s) {relative} relative to size and {plain} as plain numbers: "
            "use one kind (('size', m) for every source, or numbers for every source)"
        )
    if len(entries) != len(names):
        raise MixtureError(f"weights must be {len(names)} entries, one per source, got {len(entries)}")
    return np.array([0.0 if e is None else _multiplier(e) for e in entries], np.float64)


def sized(multipliers: np.ndarray, sizes: Sequence[int]) -> list[float]:
    """Octo's ``balance_weights``: each multiplier times its source's steps (normalized later)."""
    return (np.asarray(multipliers, np.float64) * np.asarray(sizes, np.float64)).tolist()


def following_sizes(
    multipliers: np.ndarray, sizes: Callable[[], Sequence[int]]
) -> Callable[[int], list[float]]:
    """A weight schedule that reads the sizes in force at every batch (sources that grow)."""

    def schedule(step: int) -> list[float]:
        return sized(multipliers, sizes())

    return schedule
