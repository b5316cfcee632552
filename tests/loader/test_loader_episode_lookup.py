"""The loader's batches on the disk path are the same for a seed whichever step -> episode lookup
serves them: the table of small datasets, the block index of large ones
(rlds_cli/cache/episodes.py), or the binary search it replaced."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.episodes import BlockIndex
from rlds_cli.loader import Loader, sources
from tests.loader_fixtures import TedFactory

#: 60 episodes of 2-40 steps (odd ones terminated): blocks of 2 steps, corrections at every start.
LENGTHS = [int(n) for n in np.random.default_rng(42).integers(2, 41, 60)]
SAMPLERS: list[dict[str, Any]] = [
    {"sampler": "uniform"},
    {"sampler": "slice", "slice_len": 4},
    {"sampler": "epoch"},
]


@pytest.fixture(scope="module")
def dataset(ted_dataset: TedFactory) -> Any:
    return ted_dataset(LENGTHS, "lookup")


def _batches(ds: Any, options: dict[str, Any], count: int = 6) -> list[dict[str, torch.Tensor]]:
    loader = Loader(ds, 32, seed=7, in_memory=False, **options)
    return [dict(loader.sample()) for _ in range(count)]


def _lookup(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Make new loaders use ``kind``: "table" (as shipped at this size), "index" or "search"."""
    if kind != "table":  # the disk path keeps no table, as above EPISODE_TABLE_MAX_STEPS steps
        monkeypatch.setattr(sources, "EPISODE_TABLE_MAX_STEPS", 0)
    if kind == "search":
        monkeypatch.setattr(BlockIndex, "build", classmethod(lambda cls, ends: None))


@pytest.mark.parametrize("options", SAMPLERS, ids=lambda o: o["sampler"])
def test_same_batches_for_a_seed_with_every_lookup(
    dataset: Any, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    got = {}
    for kind in ("table", "index", "search"):
        with monkeypatch.context() as mp:
            _lookup(mp, kind)
            got[kind] = _batches(dataset, options)
    for kind in ("index", "search"):
        for ref, batch in zip(got["table"], got[kind], strict=True):
            assert list(ref) == list(batch)
            for key in ref:
                assert ref[key].dtype == batch[key].dtype and torch.equal(ref[key], batch[key]), (kind, key)


def test_the_index_serves_the_disk_path_of_a_large_dataset(
    dataset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lookup(monkeypatch, "index")
    loader = Loader(dataset, 64, seed=1, in_memory=False)
    bounds = loader.source.episode_bounds
    assert bounds.table is None and bounds.block_index() is not None
    batch = loader.sample()
    # the fixture's values tell their step and episode: observation = [t, e(t), t / 2]
    steps, episode = batch["index"], batch["episode"]
    assert torch.equal(batch["observation"][:, 0], steps.float())
    assert torch.equal(batch["observation"][:, 1], episode.float())
    assert torch.equal(episode, torch.from_numpy(np.repeat(np.arange(len(LENGTHS)), LENGTHS)[steps.numpy()]))


def test_dataset_gather_reads_through_the_index(dataset: Any) -> None:
    steps = np.random.default_rng(0).integers(0, dataset.num_steps, 500)
    batch = dataset.gather(steps)
    assert dataset.episode_bounds.block_index() is not None  # no table on a Dataset
    np.testing.assert_array_equal(batch["episode"], np.repeat(np.arange(len(LENGTHS)), LENGTHS)[steps])
    np.testing.assert_array_equal(batch["observation"][:, 0], steps.astype(np.float32))
