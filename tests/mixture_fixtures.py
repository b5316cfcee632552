"""Small "robots" for the mixture tests: datasets whose actions and proprioception differ in width.

A robot dataset is written with :class:`rlds_cli.DatasetWriter` (the public writer, as users
record their own data): episodes of chosen lengths, ``action`` of ``act`` dims, ``observation``
(the proprioception) of ``obs`` dims, drawn around a per-robot mean and scale so that each
robot's statistics differ; ``next/reward`` float32, one terminated step per episode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset

#: The robots of the tests: name -> (action dims, observation dims, episode lengths, seed).
ROBOTS: dict[str, tuple[int, int, list[int], int]] = {
    "franka": (7, 8, [30, 40, 25], 1),
    "widowx": (8, 9, [50, 35], 2),
    "aloha": (14, 8, [20, 20, 20, 20], 3),
}


def write_robot(
    root: Path,
    name: str,
    act: int,
    obs: int,
    lengths: list[int],
    seed: int,
    *,
    dtype: Any = np.float32,
    extra: dict[str, int] | None = None,
) -> Dataset:
    """Write the robot dataset ``name`` into ``root`` and open it (``extra``: more float keys,
    ``{key: dims}``, per step)."""
    import rlds_cli

    rng = np.random.default_rng(seed)
    with rlds_cli.DatasetWriter(name, root=root, mode="create") as writer:
        for n in lengths:
            o = rng.normal(seed, 1.0 + seed, size=(n + 1, obs)).astype(dtype)
            episode = {
                "observation": o[:-1],
                "next/observation": o[1:],
                "action": rng.normal(-seed, 0.5 * seed, size=(n, act)).astype(dtype),
                "next/reward": rng.normal(size=n).astype(np.float32),
                "next/terminated": np.arange(n) == n - 1,
                "next/truncated": np.zeros(n, bool),
            }
            for key, dims in (extra or {}).items():
                episode[key] = rng.normal(size=(n, dims)).astype(np.float32)
            writer.add_episode(episode)
    return open_dataset(name, root)


def robot_builder(act: int, obs: int, seed: int, **options: Any) -> Callable[..., Dataset]:
    """A ``build`` for the ``ted_dataset`` fixture: ``build(root, name, lengths, backend)``."""

    def build(root: Path, name: str, lengths: list[int], backend: str = "memmap") -> Dataset:
        return write_robot(root, name, act, obs, lengths, seed, **options)

    return build
