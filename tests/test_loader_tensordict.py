"""TensorDict batches and a TorchRL replay buffer over the cache (skipped when not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # the slice padding mask under the key TorchRL's losses read
    assert tuple(slices.batch_size) == (2, 3) and slices["collector", "mask"].dtype == torch.bool


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


def _slices_within_episodes(td: Any, num_slices: int) -> None:
    episode = td["episode"].reshape(num_slices, -1)
    index = td["index"].reshape(num_slices, -1)
    assert (episode == episode[:, :1]).all()  # every slice inside one rlds episode
    assert (index.diff(dim=1) == 1).all()  # consecutive steps


@pytest.mark.parametrize(
    "options", [{"traj_key": "episode"}, {"end_key": ("next", "done")}, {}], ids=["traj", "end", "auto"]
)
def test_torchrl_slice_sampler_boundaries_are_cached(ds: Dataset, options: dict[str, Any]) -> None:
    """The read-only storage gives TorchRL's SliceSampler static boundaries, equal to those it
    computes itself from ``storage[:]``, and its slices stay inside episodes."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer, rlds_storage

    sampler = SliceSampler(num_slices=4, **options)
    rb = make_replay_buffer(ds, batch_size=12, sampler=sampler)
    assert sampler.cache_values and "static-stop-and-length" in sampler._cache
    own = SliceSampler(num_slices=4, **options)  # TorchRL's own path, reading storage[:]
    for mine, theirs in zip(
        sampler._cache["static-stop-and-length"], own._get_stop_and_length(rlds_storage(ds)), strict=True
    ):
        assert torch.equal(mine, theirs)
    for _ in range(20):
        _slices_within_episodes(rb.sample(), 4)


def test_torchrl_cached_slice_sampler_reads_no_full_storage(
    ds: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After set-up, sampling reads only the sampled rows, never the whole dataset."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    rb = make_replay_buffer(ds, batch_size=12, sampler=SliceSampler(num_slices=4, traj_key="episode"))
    source = rb.storage._source
    sizes: list[int] = []
    gather = source.gather
    monkeypatch.setattr(source, "gather", lambda idx: sizes.append(idx.size) or gather(idx))
    for _ in range(5):
        rb.sample()
    assert sizes and set(sizes) == {12}  # batches (TorchRL may read one twice), never storage[:]


def test_torchrl_slice_sampler_reads_only_its_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchRL's SliceSampler over the rlds replay buffer reads only the rows of each batch
    (issue 16): uncached, it read ``storage[:]["episode"]``, the whole dataset, at every sample
    (~100x the cost of rlds's own slice sampler). Counted in rows, not timed: the cost ratio
    against rlds's sampler is measured in ``make bench``, where timings belong."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    monkeypatch.setenv("RLDS_FSYNC", "0")
    big = make_ted(tmp_path, "slices", [250] * 200)  # 50,000 steps
    rb = make_replay_buffer(big, batch_size=256, sampler=SliceSampler(num_slices=8, traj_key="episode"))
    source = rb._storage._source
    gather = source.gather
    rows: list[int] = []

    def counting(idx: Any) -> Any:
        rows.append(int(np.asarray(idx).size))
        return gather(idx)

    monkeypatch.setattr(source, "gather", counting)
    for _ in range(5):
        rb.sample()
    assert rows and max(rows) <= 256, rows  # the batch's rows; uncached: 50,000 a sample
    _slices_within_episodes(rb.sample(), 8)
