"""Options that pick numbers: ``A:B`` ranges (episodes of a conversion or a view) and number
selections (checkpoints of a run, files of a registry entry).

:func:`parse_range` reads every ``"A:B"`` of rlds. A selection (:func:`parse_numbers`) is
``"A:B"`` (``A <= N < B``; either side may be empty), ``"3,5,9"``, one number, or a list of
numbers: the format reader (``checkpoints`` of ``atari_dqn``) and the registry's file sets
(which files to download) parse it here, so both always pick the same numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np

from rlds_cli.errors import InvalidSelectionError

__all__ = ["NumberSelection", "parse_index_list", "parse_numbers", "parse_range"]

#: A predicate on numbers (``None``: every number) and the numbers named one by one (``None``
#: for a range), which a caller may require to exist.
NumberSelection = tuple[Callable[[int], bool] | None, set[int] | None]


def parse_numbers(spec: object) -> NumberSelection:
    """``spec`` -> (predicate, named numbers); ``None`` selects everything.

    Raises:
        ValueError: ``spec`` is none of the accepted shapes or names a negative number; for a
            range, :func:`parse_range`'s :class:`~rlds_cli.errors.InvalidSelectionError` (a
            ``ValueError``).
    """
    if spec is None:
        return None, None
    if isinstance(spec, str) and ":" in spec:
        start, stop = parse_range(spec, negative=False)
        lo = start or 0
        return (lambda n: n >= lo and (stop is None or n < stop)), None
    parts: list[Any]
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
    elif isinstance(spec, int | np.integer) and not isinstance(spec, bool):
        parts = [spec]
    elif isinstance(spec, list | tuple):
        parts = list(spec)
    else:
        raise ValueError(spec)
    if any(isinstance(p, bool | float) for p in parts):
        raise ValueError(spec)
    try:
        wanted = {int(p) for p in parts}
    except (TypeError, ValueError):
        raise ValueError(spec) from None
    if not wanted or min(wanted) < 0:
        raise ValueError(spec)
    return wanted.__contains__, wanted


def parse_range(spec: object, *, negative: bool) -> tuple[int | None, int | None]:
    """``"A:B"`` -> ``(A, B)`` (``None`` for an empty side), or ``[A, B]`` as a manifest stores
    it (``A`` an int, ``B`` an int or ``None``).

    ``negative=True`` allows any values, read as a Python slice (a view knows its parent's episode
    count); ``negative=False`` requires ``0 <= A < B`` (a conversion's stream does not know its
    count in advance, nor does a selection of files or checkpoints).

    Raises:
        InvalidSelectionError: ``spec`` is not of that form, or breaks those rules.
    """
    parts: list[Any] = []
    if isinstance(spec, str):
        with contextlib.suppress(ValueError):  # a side that is no integer: not of the form
            parts = [int(p) if p.strip() else None for p in spec.split(":")]
    elif isinstance(spec, tuple | list) and spec and isinstance(spec[0], Integral):
        parts = list(spec)
    if len(parts) != 2 or not all(p is None or isinstance(p, Integral) for p in parts):
        raise InvalidSelectionError(
            f"episode range {spec!r} is not of the form A:B",
            # a conversion's stream cannot count from the end: its hint gives no negative example
            hint=None if negative else "episode ranges are A:B with 0 <= A < B, e.g. 0:500 or 100:",
        )
    start, stop = (None if p is None else int(p) for p in parts)
    if not negative and ((start or 0) < 0 or (stop is not None and stop <= (start or 0))):
        raise InvalidSelectionError(
            f"episode range {spec!r} must be A:B with 0 <= A < B (B empty: to the end)",
            hint="for a range counted from the end, convert everything and make a view ('rlds view')",
        )
    return start, stop


def parse_index_list(spec: str, count: int, *, what: str = "episode") -> np.ndarray:
    """``"0,5,9-20"`` -> the ascending, distinct positions it names (int64): numbers and
    inclusive ``A-B`` runs, comma-separated, each in ``[0, count)``; a number given twice counts
    once.

    Raises:
        InvalidSelectionError: An item is no number or run, a run goes down, or a position is
            outside ``[0, count)``.
    """
    chosen: list[np.ndarray] = []
    for item in str(spec).split(","):
        text = item.strip()
        lo_text, dash, hi_text = text.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise InvalidSelectionError(
                f"{what} list {spec!r}: {text!r} is no {what} number or run A-B",
                hint=f"give {what} numbers and runs, comma-separated, e.g. 0,5,9-20",
            ) from None
        if hi < lo:
            raise InvalidSelectionError(
                f"{what} list {spec!r}: the run {text!r} goes down", hint="write runs A-B with A <= B"
            )
        if hi >= count:
            raise InvalidSelectionError(
                f"{what} list {spec!r}: {what} {hi} is outside 0..{count - 1} ({count} {what}s)",
                hint=f"{what} numbers count from 0",
            )
        chosen.append(np.arange(lo, hi + 1, dtype=np.int64))
    return np.unique(np.concatenate(chosen))
