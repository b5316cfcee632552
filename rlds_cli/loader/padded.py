"""Padded slice sampling: where a slice may start, AMAGO's ``padded_sampling`` modes.

AMAGO (``amago/loading.py``, ``RLData.random_slice``) picks the start ``s`` of a
``length``-step window in an episode of ``L`` steps uniformly from a range that depends on the
mode, then keeps the steps ``max(s, 0) .. min(s + length, L) - 1`` and pads the rest at the end
of the sequence (its collate pads every sequence at the end):

========== ==================================== =====================================
mode       starts ``s`` (each equally likely)   what it adds
========== ==================================== =====================================
``none``   ``0 .. L - length``                  whole windows only
``both``   ``-(length - 1) .. L - 2``           windows cut at both ends
``left``   ``-(length - 1) .. L - length``      windows cut at the episode's start
``right``  ``0 .. L - 2``                       windows cut at the episode's end
========== ==================================== =====================================

and ``s = 0`` whatever the mode when ``L <= length`` (the whole episode, end-padded). A window
cut at the start holds the episode's first steps at the front of the slice: its first row is
step 0 of the episode, so a sequence model sees episode starts late in its context as well as at
position 0 (``right``'s windows are the mirror: an episode's last steps early in the slice).

Here one window is a pair (episode, start); :func:`start_ranges` gives, per episode, the first
start (relative to the episode's first step, negative for a window cut at its start) and the
number of starts, from which the slice sampler draws (every start of an episode equally
likely, as in AMAGO; how episodes are weighted is the sampler's ``weight``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Padded = Literal["none", "both", "left", "right"]
PADDED_MODES: tuple[str, ...] = ("none", "both", "left", "right")


def start_ranges(lengths: np.ndarray, slice_len: int, padded: str) -> tuple[np.ndarray, np.ndarray]:
    """``(first, count)`` per episode: window starts ``first .. first + count - 1`` (relative to
    the episode's first step) for slices of ``slice_len`` steps under AMAGO's ``padded`` mode.

    Episodes of at most ``slice_len`` steps have the one start 0 (the sampler's ``short``
    policy then decides whether the shorter ones are padded, skipped or refused).
    """
    lengths = np.asarray(lengths, np.int64)
    n = slice_len
    if padded == "none":
        first, last = np.zeros_like(lengths), lengths - n
    elif padded == "both":
        first, last = np.full_like(lengths, 1 - n), lengths - 2
    elif padded == "left":
        first, last = np.full_like(lengths, 1 - n), lengths - n
    elif padded == "right":
        first, last = np.zeros_like(lengths), lengths - 2
    else:
        raise ValueError(f"padded must be one of {', '.join(map(repr, PADDED_MODES))}; got {padded!r}")
    fits = lengths <= n  # AMAGO: `if len(self) <= length: start = 0`
    first = np.where(fits, 0, first)
    count = np.where(fits, 1, last - first + 1)
    return first, count


def padded_windows(
    starts: np.ndarray, episode_first: np.ndarray, episode_end: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``[n, slice_len]`` and mask of windows starting at the (possibly virtual) global
    steps ``starts`` in episodes spanning ``[episode_first, episode_end)``: the window's steps
    inside its episode come first, and the rest repeats its last one with ``mask`` False."""
    first = np.maximum(starts, episode_first)[:, None]
    last = (np.minimum(starts + offsets.size, episode_end) - 1)[:, None]
    idx = first + offsets
    mask = idx <= last
    return np.minimum(idx, last), mask
