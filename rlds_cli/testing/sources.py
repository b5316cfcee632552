"""Small sources and datasets the contract suites start from, in upstream layouts or through the
cache's builder, and the user functions the executor contract runs by ``"module:function"``
reference. Imports no pytest (rlds's test fixtures and preprocess's worker processes import it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    import h5py  # only the suites that write a D4RL file need it

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
    """The hand-written 3-episode D4RL file of the golden tests.

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


def ogbench_file(path: Path) -> Path:
    """An OGBench ``.npz`` of 9 rows (terminals at rows 3, 4 and 8): another format's source for
    the reader contract's "does not claim it" check."""
    i = np.arange(9, dtype=np.float32)
    terminals = np.zeros(9, bool)
    terminals[[3, 4, 8]] = True
    arrays = {
        "observations": np.stack([i, 10 * i], axis=1),
        "actions": -i[:, None],
        "terminals": terminals,
        "qpos": (i / 2)[:, None],
        "qvel": np.stack([i, i], axis=1) * 0.25,
    }
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
    return path


def make_dataset(
    name: str, lengths: list[int], *, backend: str = "memmap", terminated: bool = True, replace: bool = False
) -> None:
    """A cached dataset ``name`` of episodes of the given lengths; step t (global) has observation
    [t, 10 t] (+ 0.5 for an episode's final observation), action [t / 2], reward t + 1. Even
    episodes are terminated (if ``terminated``), the others truncated."""
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.formats.base import StepBlock

    steps = sum(lengths)
    obs, ends, term, trunc = [], [], np.zeros(steps, bool), np.zeros(steps, bool)
    t = 0
    for e, length in enumerate(lengths):
        rows = np.arange(t, t + length + 1, dtype=np.float32)
        rows[-1] = t + length - 1 + 0.5
        obs.append(np.stack([rows, 10 * rows], axis=1))
        t += length
        ends.append(t - 1)
        (term if (e % 2 == 0 and terminated) else trunc)[t - 1] = True
    block = StepBlock(
        steps={
            "action": (np.arange(steps, dtype=np.float32) / 2)[:, None],
            "next/reward": np.arange(steps, dtype=np.float32) + 1,
            "next/terminated": term,
            "next/truncated": trunc,
            "info/qpos": -np.arange(steps, dtype=np.float32),
        },
        observations={"observation": np.concatenate(obs)},
        ends=np.asarray(ends) - 0,
    )
    with DatasetBuilder(name, backend=backend, replace=replace) as builder:
        builder.append(block)
        builder.commit()


def identity(batch: Any) -> Any:
    return batch


def normalize(batch: Any) -> Any:
    """Observation normalization with fixed constants (a cheap vectorized function)."""
    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = ((batch[key] - 1.5) / 2.0).astype(np.float32)
    return out


def raises(batch: Any) -> Any:
    if batch["index"][0] >= 16:  # not in schema inference (which starts at step 0)
        raise ValueError("boom in user code")
    return batch
