"""The TED episode rules: one row per step per key, and ``done`` exactly at each episode's end.

``done`` is ``next/terminated | next/truncated``.

Each rule returns a :class:`Problem` or ``None`` and never raises; :mod:`rlds_cli.cache.builder`,
:mod:`rlds_cli.write.validate` and :mod:`rlds_cli.inspection.validate` word their own errors.
Rules are vectorised over rows. Episode ends are StepBlock's ``ends``: the sorted positions of
each episode's last step (inclusive).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from rlds_cli.cache.ted import REQUIRED_STEP_KEYS

#: Kinds of :class:`Problem`.
Kind = Literal["missing keys", "rows", "ends", "no steps", "done before end", "end not done"]
#: Required step keys are absent (:attr:`Problem.keys` names them).
MISSING_KEYS: Final = "missing keys"
#: A key has not the rows expected (:attr:`Problem.rows` is ``None`` for a 0-d value).
ROWS: Final = "rows"
#: Episode ends that are not sorted, unique and inside the rows.
ENDS: Final = "ends"
#: An episode without a step.
NO_STEPS: Final = "no steps"
#: ``done`` is set on a step that is not its episode's last.
DONE_BEFORE_END: Final = "done before end"
#: An episode's last step has ``done`` false.
END_NOT_DONE: Final = "end not done"


@dataclass(frozen=True)
class Problem:
    """One break of an episode rule.

    Attributes:
        kind: Which rule (:data:`MISSING_KEYS`, :data:`ROWS`, :data:`ENDS`, :data:`NO_STEPS`,
            :data:`DONE_BEFORE_END`, :data:`END_NOT_DONE`).
        key: The key at fault, for :data:`ROWS`.
        step: The step at fault (position in the rows checked), for the ``done`` rules.
        episode: The episode of that step, counted from the one open at the first row checked.
        rows: The rows the key has (``None``: a 0-d value without a row axis).
        expected: The rows it should have.
        keys: The keys missing, for :data:`MISSING_KEYS`.
    """

    kind: Kind
    key: str | None = None
    step: int | None = None
    episode: int | None = None
    rows: int | None = None
    expected: int | None = None
    keys: tuple[str, ...] = ()


def missing_step_keys(keys: Collection[str]) -> Problem | None:
    """The required step keys (:data:`~rlds_cli.cache.ted.REQUIRED_STEP_KEYS`, in order) that
    ``keys`` lacks; a group (``action/0``, ``action/goal``) counts as its key."""
    missing = tuple(
        k for k in REQUIRED_STEP_KEYS if k not in keys and not any(s.startswith(f"{k}/") for s in keys)
    )
    return Problem(MISSING_KEYS, keys=missing) if missing else None


def rows_problem(columns: Mapping[str, Any], expected: int) -> Problem | None:
    """The first column (in mapping order) without ``expected`` rows, or a 0-d one."""
    for key, values in columns.items():
        shape = np.shape(values)
        if not shape or shape[0] != expected:
            return Problem(ROWS, key=key, rows=int(shape[0]) if shape else None, expected=expected)
    return None


def ends_problem(ends: np.ndarray, n: int) -> Problem | None:
    """Whether ``ends`` are sorted, unique and inside ``[0, n)``."""
    if len(ends) and (ends[0] < 0 or ends[-1] >= n or np.any(np.diff(ends) <= 0)):
        return Problem(ENDS, expected=n)
    return None


def last_steps(ends: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Whether each step of ``[start, stop)`` is its episode's last, from sorted ``ends`` (which
    may cover a wider range)."""
    ends = np.asarray(ends)
    last = np.zeros(stop - start, bool)
    lo, hi = np.searchsorted(ends, [start, stop])
    last[ends[lo:hi] - start] = True
    return last


def done_mismatches(done: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every break of the ``done`` rule as positions: ``(early, unended)``: steps done before
    their episode's last, and last steps not done.

    Args:
        done: ``next/terminated | next/truncated`` of each step, ``(n,)`` bool.
        last: Whether each step is its episode's last (:func:`last_steps`), ``(n,)`` bool.
    """
    return np.flatnonzero(done & ~last), np.flatnonzero(last & ~done)


def done_problem(done: np.ndarray, last: np.ndarray) -> Problem | None:
    """The first step (of either kind of :func:`done_mismatches`) where ``done`` differs from
    ``last``; ``None`` when ``done`` is true exactly at the episodes' last steps."""
    if np.array_equal(done, last):  # the common case: one pass, nothing allocated
        return None
    step = int(np.flatnonzero(done != last)[0])
    kind: Kind = END_NOT_DONE if last[step] else DONE_BEFORE_END
    return Problem(kind, step=step, episode=int(np.count_nonzero(last[:step])))


def episode_done_problem(done: np.ndarray) -> Problem | None:
    """The ``done`` rule for one whole episode: :data:`NO_STEPS` if empty, :data:`END_NOT_DONE`
    if its last step is not done (checked first), :data:`DONE_BEFORE_END` at the first early
    done."""
    n = len(done)
    if n == 0:
        return Problem(NO_STEPS)
    if not done[-1]:
        return Problem(END_NOT_DONE, step=n - 1, episode=0)
    if done[:-1].any():
        return Problem(DONE_BEFORE_END, step=int(np.flatnonzero(done)[0]), episode=0)
    return None
