"""TensorDict batches and a TorchRL replay buffer over the cache (skipped when not installed)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader
from tests.loader_fixtures import make_ted

tensordict = pytest.importorskip("tensordict")

LENGTHS = [6, 9, 3, 12]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        yield make_ted(tmp_path_factory.mktemp("tdict"), "tdict", LENGTHS)


def test_loader_returns_tensordicts(ds: Dataset) -> None:
    td = Loader(ds, 8, as_tensordict=True, seed=0).sample()
    assert isinstance(td, tensordict.TensorDict)
    assert tuple(td.batch_size) == (8,)
    index = td["index"].numpy()
    want = ds.gather(index, ["next/observation", "next/done"])
    np.testing.assert_array_equal(td["next", "observation"].numpy(), want["next/observation"])
    np.testing.assert_array_equal(td["next", "done"].numpy(), want["next/done"])
    slices = Loader(ds, 6, sampler="slice", slice_len=3, as_tensordict=True).sample()
    assert tuple(slices.batch_size) == (2, 3) and slices["mask"].dtype == torch.bool


def test_torchrl_replay_buffer_over_the_cache(ds: Dataset) -> None:
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    rb = make_replay_buffer(ds, batch_size=16)
    assert len(rb) == ds.num_steps
    td = rb.sample()
    assert td.batch_size == (16,)
    want = ds.gather(td["index"].numpy(), ["observation", "next/reward"])
    np.testing.assert_array_equal(td["observation"].numpy(), want["observation"])
    rb = make_replay_buffer(ds, batch_size=12, sampler=SliceSampler(num_slices=4, traj_key="episode"))
    td = rb.sample()
    episode = td["episode"].reshape(4, 3)
    assert (episode == episode[:, :1]).all()  # TorchRL's slices stay inside rlds episodes
    with pytest.raises(TypeError, match="read-only"):
        rb.extend(td)
