"""Small datasets built with the cache's own builder, for the tests of what reads or derives
from a cache (preprocess, verify, remote, trust): known values at every step, so a test can
state what each output must hold."""

from __future__ import annotations

import numpy as np

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.opening import open_dataset
from rlds_cli.formats.base import StepBlock


def make_dataset(
    name: str, lengths: list[int], *, backend: str = "memmap", terminated: bool = True, replace: bool = False
) -> None:
    """Episodes of the given lengths; step t (global) has observation [t, 10 t] (+ 0.5 for an
    episode's final observation), action [t / 2], reward t + 1. Odd episodes are truncated."""
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


def everything(name: str) -> dict[str, np.ndarray]:
    ds = open_dataset(name)
    return dict(ds[:]) | {"_episodes": ds.episodes}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert np.array_equal(a[key], b[key]), key


def uid_episode(uid: int, length: int) -> dict[str, np.ndarray]:
    """An episode for ``DatasetWriter.add_episode`` whose every row says which episode it is
    (``info/episode_uid`` and ``observation[:, 0]``) and its step (``observation[:, 1]``): a
    served row that belongs to no committed, live episode shows."""
    t = np.arange(length + 1, dtype=np.float32)
    obs = np.stack([np.full_like(t, uid), t], axis=1)
    flags = np.zeros((length, 1), bool)
    flags[-1] = True
    return {
        "observation": obs[:-1],
        "next/observation": obs[1:],
        "action": np.zeros((length, 1), np.float32),
        "next/reward": np.ones((length, 1), np.float32),
        "next/terminated": flags,
        "next/truncated": np.zeros_like(flags),
        "info/episode_uid": np.full(length, uid, np.int64),
    }
