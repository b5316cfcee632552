"""Small datasets for the loader tests, with episodes of chosen lengths and telling values.

Step ``i`` (in dataset order) has ``observation = [i, episode, 0.5 i]``, ``action = [0.1 i, -i]``,
``reward = i``; each episode's final observation is ``[-(last + 1), episode, 0]``. Odd episodes
end by termination, even ones by a time limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.convert import convert
from tests.d4rl_fixtures import write_d4rl


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
