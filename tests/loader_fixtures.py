"""Small datasets for the loader tests, with episodes of chosen lengths and telling values.

Step ``i`` (in dataset order) has ``observation = [i, episode, 0.5 i]``, ``action = [0.1 i, -i]``,
``reward = i``; each episode's final observation is ``[-(last + 1), episode, 0]``. Odd episodes
end by termination, even ones by a time limit.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl


class TedFactory(Protocol):
    """The ``ted_dataset`` fixture (tests/conftest.py): the dataset ``name`` of episodes of
    ``lengths``, built by ``build(root, name, lengths, backend)`` (default :func:`make_ted`: every
    value tells its step) in ``root`` or a fresh temp folder, opened."""

    def __call__(
        self,
        lengths: list[int],
        name: str = "ted",
        *,
        backend: str = "memmap",
        root: Path | None = None,
        build: Callable[..., Dataset] = ...,
    ) -> Dataset: ...


def make_ted(root: Path, name: str, lengths: list[int], backend: str = "memmap") -> Dataset:
    """Convert a D4RL file with episodes of ``lengths`` into ``root`` and open it."""
    n = int(sum(lengths))
    ends = np.cumsum(lengths)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    i = np.arange(n, dtype=np.float32)
    obs = np.stack([i, episode.astype(np.float32), 0.5 * i], axis=1)
    nxt = np.concatenate([obs[1:], obs[-1:]]).copy()
    nxt[ends - 1] = np.stack(
        [-(ends.astype(np.float32)), np.arange(len(lengths), dtype=np.float32), 0 * ends], 1
    )
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    odd = np.arange(len(lengths)) % 2 == 1
    terminals[ends[odd] - 1] = True
    timeouts[ends[~odd] - 1] = True
    src = write_d4rl(
        root / f"{name}.hdf5",
        observations=obs,
        actions=np.stack([0.1 * i, -i], axis=1),
        rewards=i.copy(),
        terminals=terminals,
        timeouts=timeouts,
        next_observations=nxt,
    )
    convert(src, name, format="d4rl", root=root, backend=backend)
    ds = open_dataset(name, root)
    assert ds.num_steps == n and list(ds.episodes["length"]) == list(lengths)
    return ds


def make_pixels(root: Path, lengths: list[int], frame: tuple[int, ...], generator: str) -> Dataset:
    """A memmap dataset ``pix`` in ``root``: random-byte uint8 frames of shape ``frame`` (so any
    misplaced or overwritten row shows) and random low-dim keys, episodes of ``lengths`` ending
    truncated."""
    import pytest

    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.formats.base import StepBlock

    rng = np.random.default_rng(0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        with DatasetBuilder("pix", root=root, backend="memmap") as builder:
            for n in lengths:
                truncated = np.zeros((n, 1), bool)
                truncated[-1] = True
                builder.append(
                    StepBlock(
                        steps={
                            "action": rng.standard_normal((n, 2)).astype(np.float32),
                            "next/reward": rng.standard_normal((n, 1)).astype(np.float32),
                            "next/terminated": np.zeros((n, 1), bool),
                            "next/truncated": truncated,
                        },
                        observations={"observation": rng.integers(0, 256, (n + 1, *frame), np.uint8)},
                        ends=np.array([n - 1]),
                    )
                )
            builder.commit(source={"generator": generator})
    return open_dataset("pix", root)


def resumed_batches(
    make: Callable[[int], Any], *, skip: int, take: int, seeds: tuple[int, int]
) -> tuple[list, list]:
    """Whether a loader resumes its stream exactly: the ``take`` batches that follow the first
    ``skip`` of ``make(seeds[0])``, iterated, and the ``take`` batches of ``make(seeds[1])``
    restored from the first's state at that point (pickled, as a checkpoint is). Both loaders
    are closed before it returns."""
    first = make(seeds[0])
    it = iter(first)
    for _ in range(skip):
        next(it)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    want = [next(it) for _ in range(take)]
    second = make(seeds[1])
    second.load_state_dict(state)
    it2 = iter(second)
    got = [next(it2) for _ in range(take)]
    first.close()
    second.close()
    return want, got
