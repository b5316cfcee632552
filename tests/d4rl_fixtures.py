"""Code that writes D4RL-format HDF5 files in the exact real layout, for the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np


def write_d4rl(
    path: Path,
    *,
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminals: np.ndarray,
    timeouts: np.ndarray | None = None,
    next_observations: np.ndarray | None = None,
    infos: dict[str, np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
    omit: tuple[str, ...] = (),
) -> Path:
    """Write a D4RL file: root datasets, ``infos/*`` and ``metadata/*`` as the d4rl generators do.

    ``omit`` drops named root datasets (to make broken files).
    """
    data = {
        "observations": observations,
        "actions": actions,
        "rewards": rewards,
        "terminals": terminals,
        "timeouts": timeouts,
        "next_observations": next_observations,
    }
    with h5py.File(path, "w") as f:
        for key, value in data.items():
            if value is not None and key not in omit:
                f.create_dataset(key, data=value)
        for key, value in (infos or {}).items():
            f.create_dataset(f"infos/{key}", data=value)
        for key, value in (metadata or {}).items():
            f.create_dataset(f"metadata/{key}", data=value)
    return path


def golden_three_episodes(path: Path, *, with_next: bool) -> Path:
    """The hand-written 3-episode file of the golden tests.

    Rows 0-2 end by a terminal (row 2), rows 3-5 by a timeout (row 5), rows 6-7 by the end of
    the file. Observation row ``i`` is ``[i, 10 i]``; ``next_observations[i]`` (when written)
    is ``observations[i + 1]`` inside an episode and ``[100 + i, 0]`` at each episode's end.
    """
    n = 8
    obs = np.stack([np.arange(n), 10 * np.arange(n)], axis=1).astype(np.float32)
    nxt = None
    if with_next:
        nxt = np.concatenate([obs[1:], obs[-1:]]).copy()
        for end in (2, 5, 7):
            nxt[end] = [100 + end, 0]
    return write_d4rl(
        path,
        observations=obs,
        actions=(np.arange(n, dtype=np.float32) * 0.5)[:, None],
        rewards=np.arange(n, dtype=np.float32) + 1,
        terminals=np.array([0, 0, 1, 0, 0, 0, 0, 0], bool),
        timeouts=np.array([0, 0, 0, 0, 0, 1, 0, 0], bool),
        next_observations=nxt,
        infos={"qpos": np.arange(n, dtype=np.float32) * -1},
        metadata={"algorithm": b"SAC", "iteration": np.int32(3)},
    )
