"""``torch.utils.data`` integration: workers under spawn and fork, sharding, epochs, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader.epoch import EpochSampler, epoch_permutation, shard
from rlds_cli.loader.samplers import uniform_ints
from rlds_cli.loader.torch_data import EpochBatchSampler, TedIterableDataset, TedMapDataset, collate_ted
from tests.loader_fixtures import TedFactory

LENGTHS = [40, 13, 77, 5, 64, 1, 50]  # 250 steps: not a multiple of the batch size
N = sum(LENGTHS)


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "td")


def _indices(batches: list) -> list[int]:
    return np.concatenate([np.asarray(b["index"]) for b in batches]).tolist()


def test_only_paths_are_pickled(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 32)
    it._source = None
    it.__iter__().__next__()  # opens the memory maps in this process
    blob = pickle.dumps(it)
    assert len(blob) < 4000  # the path, the manifest and settings; never arrays
    clone = pickle.loads(blob)
    assert clone._source is None and clone.dataset.directory == ds.directory
    assert len(pickle.dumps(TedMapDataset(ds))) < 4000


def test_iterable_two_spawn_workers_cover_the_epoch_once(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 16, keys=["observation", "next/reward"], seed=3)
    loader = DataLoader(
        it, batch_size=None, num_workers=2, multiprocessing_context="spawn", collate_fn=collate_ted
    )
    batches = list(loader)
    seen = _indices(batches)
    assert sorted(seen) == list(range(N))  # no duplicate, none missing
    for b in batches:  # values are the steps' own
        np.testing.assert_array_equal(b["observation"][:, 0].numpy(), b["index"].numpy().astype(np.float32))
        assert isinstance(b["next", "reward"], torch.Tensor)


def test_map_style_two_spawn_workers_with_batch_sampler(ds: Dataset) -> None:
    sampler = EpochBatchSampler(N, 32, seed=1)
    loader = DataLoader(
        TedMapDataset(ds, keys=["action"]),
        batch_sampler=sampler,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=collate_ted,
    )
    epoch0 = _indices(list(loader))
    sampler.set_epoch(1)
    epoch1 = _indices(list(loader))
    assert sorted(epoch0) == sorted(epoch1) == list(range(N))
    assert epoch0 != epoch1  # reshuffled per epoch, by (seed, epoch)


def test_persistent_fork_workers_count_their_epochs(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 25, keys=[], seed=0)
    loader = DataLoader(
        it,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        collate_fn=collate_ted,
    )
    first, second = _indices(list(loader)), _indices(list(loader))
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second
    # without workers, set_epoch picks the permutation
    it0 = TedIterableDataset(ds, 25, keys=[], seed=0)
    it0.set_epoch(1)
    assert sorted(_indices(list(it0))) == list(range(N))


def test_ranks_shard_without_overlap(ds: Dataset) -> None:
    parts = [
        _indices(list(TedIterableDataset(ds, 10, keys=[], seed=4, rank=r, world_size=3))) for r in range(3)
    ]
    assert len({len(p) for p in parts}) == 1  # same number of steps on every rank
    assert set().union(*map(set, parts)) == set(range(N))
    assert sum(map(len, parts)) == -(-N // 3) * 3  # only DistributedSampler-style padding repeats
    samplers = [list(EpochBatchSampler(N, 10, seed=0, rank=r, world_size=3)) for r in range(3)]
    assert len({len(s) for s in samplers}) == 1
    with pytest.raises(ValueError, match="rank must be in"):
        TedIterableDataset(ds, 10, rank=3, world_size=3)


def test_uniform_stream_seeded_by_rank_and_worker(ds: Dataset) -> None:
    def first(rank: int) -> list[int]:
        it = TedIterableDataset(
            ds, 8, keys=[], shuffle="uniform", seed=7, rank=rank, world_size=2, num_batches=2
        )
        return _indices(list(it))

    assert first(0) == first(0) and first(0) != first(1)
    with pytest.raises(ValueError, match="shuffle must be"):
        TedIterableDataset(ds, 8, shuffle="random")


def test_map_style_items(ds: Dataset) -> None:
    m = TedMapDataset(ds)
    assert len(m) == N
    item = m[41]
    assert item["index"] == 41 and item["episode"] == 1
    np.testing.assert_array_equal(item["observation"], [41, 1, 20.5])
    with pytest.raises(IndexError):
        m[N]
    # the default collate also works (items stacked one by one)
    batch = next(iter(DataLoader(m, batch_size=4, collate_fn=collate_ted)))
    assert batch["index"].tolist() == [0, 1, 2, 3]


def test_batched_items_read_as_single_items(ds: Dataset) -> None:
    """``__getitems__`` (what DataLoader calls) passed -1 through unchecked: per-step keys wrapped
    to the last step while observations came from step 1 (one row, three steps)."""
    m = TedMapDataset(ds)
    batch = m.__getitems__([-1, 0, -N])
    for i, at in enumerate((-1, 0, -N)):
        one = m[at]
        for key in one:
            np.testing.assert_array_equal(batch[key][i], one[key], err_msg=key)
    with pytest.raises(IndexError, match=f"out of range for {N} steps"):
        m.__getitems__([N])
    with pytest.raises(TypeError, match="integers"):
        m.__getitems__([1.5])
    with pytest.raises(TypeError, match="an integer, not float"):
        m[1.5]  # type: ignore[index]


def test_epoch_orders_are_the_epoch_samplers(ds: Dataset) -> None:
    """Both adapters take their permutation and shard from EpochSampler: the same indices, in
    the same order, as the loader's "epoch" sampler (and as the (seed, epoch) permutation)."""
    for rank in range(3):
        batches = EpochBatchSampler(N, 10, seed=5, rank=rank, world_size=3)
        sampler = EpochSampler(N, 10, 5, rank=rank, world_size=3)
        iterable = TedIterableDataset(ds, 10, keys=[], seed=5, rank=rank, world_size=3)
        for epoch in range(2):
            batches.set_epoch(epoch)
            iterable.set_epoch(epoch)
            want = shard(epoch_permutation(N, 5, epoch), rank, 3).tolist()
            assert [i for batch in batches for i in batch] == want
            assert _indices(list(iterable)) == want
            assert [i for _ in range(len(batches)) for i in sampler.sample().tolist()] == want


def test_uniform_batches_seeded_by_seed_epoch_rank_and_batch(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 8, keys=[], shuffle="uniform", seed=7, rank=1, world_size=2, num_batches=3)
    it.set_epoch(4)
    want = [uniform_ints(np.random.default_rng([7, 4, 1, b]), N, 8) for b in range(3)]
    assert _indices(list(it)) == np.concatenate(want).tolist()


def test_iterable_takes_any_sampler_with_replacement(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 12, keys=["next/reward"], shuffle="slice", slice_len=4, seed=3, num_batches=4)
    batches = list(it)
    assert [tuple(b["index"].shape) for b in batches] == [(3, 4)] * 4
    assert all(b["mask"].shape == (3, 4) and b["next", "reward"].shape[:2] == (3, 4) for b in batches)
    # the same batches with two workers: batch b's draw depends on (seed, epoch, rank, b) only
    it.set_epoch(0)  # the pass above moved it on to epoch 1
    loader = DataLoader(it, batch_size=None, num_workers=2, collate_fn=collate_ted)
    again = list(loader)
    assert [b["index"].tolist() for b in again] == [b["index"].tolist() for b in batches]
    prioritized = TedIterableDataset(ds, 8, keys=[], shuffle="prioritized", seed=3, num_batches=2)
    assert [b["weight"].shape for b in prioritized] == [(8,), (8,)]
    with pytest.raises(ValueError, match="slice_len"):
        TedIterableDataset(ds, 12, shuffle="slice")
    with pytest.raises(ValueError, match="shuffle='epoch' has no option"):
        TedIterableDataset(ds, 12, slice_len=4)


def test_a_state_of_another_dataset_of_the_same_size_is_refused(ted_dataset: TedFactory) -> None:
    """TedIterableDataset and TedDataLoader compared the step count alone: a state saved on another
    dataset of 12 steps resumed silently (Loader refused it)."""
    from rlds_cli.errors import LoaderStateError
    from rlds_cli.loader.data_loader import TedDataLoader

    a, b = ted_dataset([3, 4, 5], "a12"), ted_dataset([5, 4, 3], "b12")
    saved = TedIterableDataset(a, 4, seed=0).state_dict()
    TedIterableDataset(a, 4, seed=0).load_state_dict(saved)  # its own dataset: resumed
    with pytest.raises(LoaderStateError, match="saved on another dataset than 'b12'"):
        TedIterableDataset(b, 4, seed=0).load_state_dict(saved)

    def mapped(dataset: Dataset) -> TedDataLoader:
        return TedDataLoader(TedMapDataset(dataset), batch_sampler=EpochBatchSampler(12, 4, seed=0))

    state = mapped(a).state_dict()
    mapped(a).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="saved on another dataset than 'b12'"):
        mapped(b).load_state_dict(state)


def test_a_state_with_other_sampler_options_or_drop_last_is_refused() -> None:
    """The states recorded neither the sampler's options nor drop_last: a slice_len=8 state
    restored into slice_len=16, a drop_last=False one into drop_last=True, each another stream."""
    from rlds_cli.errors import LoaderStateError
    from tests.dataset_fixtures import make_dataset

    make_dataset("opts", [9, 12, 15, 7])
    saved = TedIterableDataset("opts", 4, shuffle="slice", slice_len=2, num_batches=5, seed=0)
    next(iter(saved))
    state = saved.state_dict()
    for options, says in (
        ({"slice_len": 4}, "option slice_len='2', not '4'"),
        ({"slice_len": 2, "padded": "both"}, "option padded"),
    ):
        other = TedIterableDataset("opts", 4, shuffle="slice", num_batches=5, seed=0, **options)
        with pytest.raises(LoaderStateError, match=says):
            other.load_state_dict(state)
    TedIterableDataset("opts", 4, shuffle="slice", slice_len=2, num_batches=5, seed=0).load_state_dict(state)
    sampler = EpochBatchSampler(43, 4, seed=0)
    next(iter(sampler))
    with pytest.raises(LoaderStateError, match="drop_last=False, not True"):
        EpochBatchSampler(43, 4, seed=0, drop_last=True).load_state_dict(sampler.state_dict())
