"""The TorchRL storage over an rlds dataset, against TorchRL's own storage of the same rows: slices
that never wrap, indexing as TorchRL's, dumps/loads, a growing dataset's view, and imports of
collector dumps (skipped when torchrl is not installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from tests.loader_fixtures import TedFactory

torchrl = pytest.importorskip("torchrl")

from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer  # noqa: E402

from rlds_cli.loader.torchrl_compat import make_replay_buffer  # noqa: E402

LENGTHS = [6, 9, 3]  # the last episode ends truncated, not terminated


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "trl_storage")


def _wraps(batch: Any, num_slices: int) -> bool:
    index = batch["index"].reshape(num_slices, -1)
    return bool((index[:, 1:] < index[:, :-1]).any())


def test_slices_by_an_end_key_never_run_from_the_last_step_to_the_first(ds: Dataset) -> None:
    """A full storage without a write cursor is circular to TorchRL: slices ended by
    ("next", "terminated") ran from the last (truncated) episode's end into episode 0."""
    for cache in (True, False):
        sampler = SliceSampler(num_slices=4, end_key=("next", "terminated"), cache_values=cache)
        rb = make_replay_buffer(ds, batch_size=12, sampler=sampler)
        torch.manual_seed(0)
        assert not any(_wraps(rb.sample(), 4) for _ in range(100)), cache
    by_end = SliceSampler(num_slices=4, end_key=("next", "terminated"))
    own = TensorDictReplayBuffer(storage=LazyTensorStorage(ds.num_steps), batch_size=12, sampler=by_end)
    own.extend(make_replay_buffer(ds).storage[:])
    torch.manual_seed(0)
    assert not any(_wraps(own.sample(), 4) for _ in range(100))  # TorchRL's own: the same rule


def test_positions_are_checked_as_torchrls_storages_check_them(ds: Dataset) -> None:
    storage = make_replay_buffer(ds).storage
    n = ds.num_steps
    mask = torch.zeros(n, dtype=torch.bool)
    mask[[3, 7]] = True
    assert storage[mask]["index"].tolist() == [3, 7]  # a mask: its rows (was rows 0 and 1)
    assert storage[[-1]]["index"].tolist() == [n - 1] and tuple(storage[...].batch_size) == (n,)
    with pytest.raises(IndexError, match=f"position {-n - 1} is outside a storage of {n} steps"):
        storage[[-n - 1]]  # was a row mixed of two steps
    with pytest.raises(IndexError, match=f"position {n} is outside"):
        storage[[n]]
    with pytest.raises(TypeError, match="storage positions must be integers, not float32"):
        storage[torch.tensor([1.7])]
    assert storage.contains(torch.tensor([-1, n, 3])).tolist() == [True, False, True]


def test_a_dumped_buffer_loads_only_over_its_dataset(
    ds: Dataset, ted_dataset: TedFactory, tmp_path: Path
) -> None:
    """``rb.dumps`` kept nothing of the storage and ``rb.loads`` into a buffer over another
    dataset went on with the other's stream."""
    rb = make_replay_buffer(ds, batch_size=4)
    rb.sample()
    rb.dumps(tmp_path / "rb")
    make_replay_buffer(ds, batch_size=4).loads(tmp_path / "rb")
    other = make_replay_buffer(ted_dataset([5, 5], "trl_other"), batch_size=4)
    with pytest.raises(ValueError, match="state is for another dataset than 'trl_other'"):
        other.loads(tmp_path / "rb")


def test_slices_by_episode_without_the_episode_key_served(ds: Dataset) -> None:
    """``keys=`` leaving out ``episode`` with ``traj_key="episode"`` failed inside TorchRL."""
    rb = make_replay_buffer(ds, batch_size=12, keys=["observation", "action"],
                            sampler=SliceSampler(num_slices=4, traj_key="episode"))  # fmt: skip
    batch = rb.sample()
    episode = np.searchsorted(np.cumsum(LENGTHS), batch["index"].numpy(), side="right").reshape(4, -1)
    assert (episode == episode[:, :1]).all()


def test_a_growing_dataset_is_served_as_the_view_it_was_opened_at(tmp_path: Path) -> None:
    """After ``ds.refresh()`` the buffer's length was the new one while its storage served the
    old rows: a raw numpy IndexError at the next sample."""
    import rlds_cli

    def episode(n: int, k: int) -> dict[str, np.ndarray]:
        obs = np.full((n + 1, 2), k, np.float32)
        return {"observation": obs[:-1], "next/observation": obs[1:], "action": np.zeros((n, 1), np.float32),
                "next/reward": np.zeros(n, np.float32), "next/terminated": np.arange(n) == n - 1,
                "next/truncated": np.zeros(n, bool)}  # fmt: skip

    with rlds_cli.DatasetWriter("grow", root=tmp_path, mode="create") as writer:
        writer.add_episode(episode(5, 0))
        writer.flush()
        ds = rlds_cli.open_dataset("grow", root=tmp_path)
        rb = make_replay_buffer(ds, batch_size=8)
        writer.add_episode(episode(5, 1))
        writer.flush()
    ds.refresh()
    assert ds.num_steps == 10 and len(rb) == 5
    assert rb.sample()["index"].max() < 5


def test_the_buffer_pickles_to_another_process(ds: Dataset) -> None:
    """The storage class is made per call: pickling it (a buffer sent to other processes) failed
    with "Can't pickle local object"."""
    import pickle

    rb = make_replay_buffer(ds, batch_size=4, keys=["observation", "action"])
    copy = pickle.loads(pickle.dumps(rb))
    assert len(copy) == ds.num_steps and sorted(copy.storage[[2]].keys()) == sorted(rb.storage[[2]].keys())
    np.testing.assert_array_equal(
        copy.storage[[2, 5]]["observation"].numpy(), ds.gather(np.array([2, 5]))["observation"]
    )
