"""Loader(refresh=N) with every named sampler, bound transforms and device loaders (issue 25).

A writer appends between batches while FIFO eviction (``capacity_episodes``) drops the oldest
unprotected episodes and a protected writer's demonstrations stay (so evictions leave holes and
rows move). Every row says which episode it is (``info/episode_uid``, ``observation[:, 0]``) and
its step (``observation[:, 1]``; see ``tests.dataset_fixtures.uid_episode``): a served row of an
episode never committed, or evicted from the loader's view, or a slice across two episodes, shows.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rlds_cli
from rlds_cli.cache.layout import COMMIT_LOG_FILE
from rlds_cli.errors import DatasetReplacedError, LoaderStateError
from rlds_cli.loader.samplers import ViewChange
from rlds_cli.loader.transforms import FrameStack
from tests.dataset_fixtures import uid_episode

KEYS = ["observation", "next/observation", "info/episode_uid"]
CAPACITY = 6  # unprotected episodes kept


def _length(uid: int) -> int:
    return 3 + uid % 5  # episodes of 3 to 7 steps: rows move when one is evicted


def _live(ds: Any) -> set[int]:
    """The uids of the episodes in ``ds``'s view."""
    starts = ds.episodes["start"]
    return set(ds.gather(starts, keys=["info/episode_uid"])["info/episode_uid"].tolist())


class Growth:
    """Commits one episode (every third one protected) per :meth:`step`; FIFO past CAPACITY."""

    def __init__(self, name: str, storage: str = "memmap") -> None:
        self.name = name
        self.committed: set[int] = set()
        self.next_uid = 1
        with rlds_cli.DatasetWriter(name, storage=storage, capacity_episodes=CAPACITY) as w:
            for _ in range(4):
                self._add(w)
        with rlds_cli.DatasetWriter(name, mode="append", protected=True) as demos:
            demos.add_episode(uid_episode(900, 6))
        self.committed.add(900)
        self.writer = rlds_cli.DatasetWriter(name, mode="append")
        self.demos = rlds_cli.DatasetWriter(name, mode="append", protected=True)

    def _add(self, w: rlds_cli.DatasetWriter) -> None:
        uid = self.next_uid
        w.add_episode(uid_episode(uid, _length(uid)))
        w.flush()  # committed (visible to a refresh) before the step returns
        self.committed.add(uid)
        self.next_uid += 1

    def step(self) -> None:
        self._add(self.demos if self.next_uid % 3 == 0 else self.writer)

    def close(self) -> None:
        self.writer.close()
        self.demos.close()


@pytest.fixture
def growth(isolated_cache: Path) -> Iterator[Growth]:
    g = Growth("grow")
    yield g
    g.close()


def check_rows(batch: Any, loader: rlds_cli.Loader, committed: set[int]) -> None:
    """Every row of ``batch`` belongs to a committed episode live in the loader's view, its
    observation is its own, and each slice (a row of a 2-d index) stays in one episode."""
    ds = loader.dataset
    uid = np.asarray(batch["info/episode_uid"])
    obs = np.asarray(batch["observation"])
    index = np.asarray(batch["index"])
    assert index.min() >= 0 and index.max() < ds.num_steps == loader.num_steps
    assert set(uid.ravel().tolist()) <= _live(ds) & committed
    assert (obs[..., 0] == uid).all()
    assert (np.asarray(batch["next/observation"])[..., 1] == obs[..., 1] + 1).all()
    if index.ndim == 2:  # slices: one episode each, consecutive steps where not padding
        assert (uid == uid[:, :1]).all()
        mask = np.asarray(batch["mask"])
        steps = obs[..., 1]
        assert (np.diff(steps, axis=1)[mask[:, 1:]] == 1).all()


SAMPLERS = {
    "uniform": {},
    "slice": {"slice_len": 3},
    "prioritized": {},
    "prioritized-slices": {"slice_len": 3},
}


@pytest.mark.parametrize("which", sorted(SAMPLERS))
def test_every_served_row_is_committed_and_live(growth: Growth, which: str) -> None:
    sampler = which.split("-")[0]
    loader = rlds_cli.Loader(
        "grow", batch_size=24, seed=3, refresh=1, sampler=sampler, keys=KEYS, **SAMPLERS[which]
    )
    for i in range(30):
        growth.step()
        if i % 4 == 0:
            growth.step()  # two commits: a refresh that evicts and appends several episodes
        batch = loader.sample()
        check_rows(batch, loader, growth.committed)
        if sampler == "prioritized":
            loader.update_priority(batch["index"], np.random.default_rng(i).random(batch["index"].shape))
    assert 900 in _live(loader.dataset)  # the protected demonstration stayed
    assert min(_live(loader.dataset) - {900}) > 1  # and the first episodes were evicted
    assert loader._refresher is not None and loader._refresher.rebuilds == 30


def test_refresh_every_n_batches_keeps_one_view_between(growth: Growth) -> None:
    loader = rlds_cli.Loader(
        "grow", batch_size=16, seed=0, refresh=3, sampler="slice", slice_len=2, keys=KEYS
    )
    for _ in range(12):
        growth.step()
        check_rows(loader.sample(), loader, growth.committed)
    assert loader._refresher is not None and loader._refresher.rebuilds == 4


def _rows_of(ds: Any, uid: int) -> np.ndarray:
    """The rows of episode ``uid`` in ``ds``'s view."""
    e = int(
        np.flatnonzero(ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"] == uid)[
            0
        ]
    )
    start, length = int(ds.episodes["start"][e]), int(ds.episodes["length"][e])
    return np.arange(start, start + length)


@pytest.mark.parametrize("slices", [False, True])
def test_prioritized_rows_keep_their_priority_across_refreshes(growth: Growth, slices: bool) -> None:
    options = {"slice_len": 3} if slices else {}
    loader = rlds_cli.Loader(
        "grow", batch_size=12, seed=1, refresh=1, sampler="prioritized", keys=KEYS, **options
    )
    sampler: Any = loader.sampler
    ds = loader.dataset
    demo, young = _rows_of(ds, 900), _rows_of(ds, 4)
    loader.update_priority(demo, np.full(len(demo), 0.25))
    loader.update_priority(young, np.arange(1, len(young) + 1, dtype=np.float64) * 3.0)
    expected_demo = (0.25 + sampler.eps) ** sampler.alpha
    expected_young = (np.arange(1, len(young) + 1) * 3.0 + sampler.eps) ** sampler.alpha
    top = sampler.max_priority**sampler.alpha
    for _ in range(4):
        growth.step()  # uid 1, 2, ... evicted: the rows of 900 and 4 move to the front
    check_rows(loader.sample(), loader, growth.committed)
    assert 1 not in _live(ds) and 4 in _live(ds)
    demo2, young2 = _rows_of(ds, 900), _rows_of(ds, 4)
    assert young2[0] < young[0]  # moved: kept by identity, not by position
    assert len(sampler.priorities) >= ds.num_steps  # (the tree rounds its leaves up)
    assert np.allclose(sampler.priorities[demo2], expected_demo)
    assert np.allclose(sampler.priorities[young2], expected_young)
    newest = _rows_of(ds, growth.next_uid - 1)
    assert np.allclose(sampler.priorities[newest], top)  # new rows: the largest priority so far
    assert sampler.priorities[ds.num_steps :].sum() == 0  # nothing past the view's end
    rlds_cli.compact("grow")  # merged segments: the same episodes, the same ids
    growth.step()
    check_rows(loader.sample(), loader, growth.committed)
    assert np.allclose(sampler.priorities[_rows_of(ds, 900)], expected_demo)
    assert np.allclose(sampler.priorities[_rows_of(ds, 4)], expected_young)


def test_an_epoch_keeps_its_snapshot_and_the_next_one_sees_the_new_rows(growth: Growth) -> None:
    loader = rlds_cli.Loader("grow", batch_size=5, seed=2, refresh=1, sampler="epoch", keys=KEYS)
    ds = loader.dataset
    snapshot = {(u, s) for u, s in _pairs(ds.gather(np.arange(ds.num_steps), keys=KEYS))}
    served: list[tuple[int, int]] = []
    evicted_unserved: set[tuple[int, int]] = set()
    for i, batch in enumerate(loader):  # one epoch
        check_rows(batch, loader, growth.committed)
        served += _pairs(batch)
        if i in (1, 3):
            before = _live(ds)
            for _ in range(4):
                growth.step()
            ds_now = rlds_cli.open_dataset("grow")
            gone = before - _live(ds_now)
            evicted_unserved |= {p for p in snapshot if p[0] in gone and p not in served}
    assert len(served) == len(set(served))  # each row at most once
    assert set(served) <= snapshot  # nothing committed during the epoch
    assert evicted_unserved and not (set(served) & evicted_unserved)
    assert set(served) == snapshot - evicted_unserved  # the rest of the snapshot, all of it
    second = [p for batch in loader for p in _pairs(batch)]  # the next epoch: the view it started on
    assert sorted(second) == sorted(_pairs(ds.gather(np.arange(ds.num_steps), keys=KEYS)))
    assert any(u >= growth.next_uid - 4 for u, _ in second)


def _pairs(batch: Any) -> list[tuple[int, int]]:
    obs = np.asarray(batch["observation"]).reshape(-1, 2)
    return [(int(u), int(s)) for u, s in obs]


def test_an_epoch_carried_over_a_refresh_checkpoints_and_resumes(growth: Growth) -> None:
    loader = rlds_cli.Loader("grow", batch_size=4, seed=5, refresh=1, sampler="epoch", keys=KEYS, epochs=None)
    loader.sample()
    growth.step()
    loader.sample()  # the epoch in progress is now carried over a refresh
    state = loader.state_dict()
    assert "order" in state["sampler"]
    rest = [loader.sample()["index"].tolist() for _ in range(3)]
    again = rlds_cli.Loader("grow", batch_size=4, seed=5, sampler="epoch", keys=KEYS, epochs=None)
    again.load_state_dict(state)
    assert [again.sample()["index"].tolist() for _ in range(3)] == rest
    bad = {**state, "sampler": {**state["sampler"], "order": np.array([0, again.num_steps]), "position": 0}}
    with pytest.raises(LoaderStateError, match="past the dataset"):
        again.load_state_dict(bad)


def test_framestack_is_bound_again_to_each_view(growth: Growth) -> None:
    loader = rlds_cli.Loader(
        "grow", batch_size=16, seed=4, refresh=1, keys=KEYS, transform=FrameStack(3, ["observation"])
    )
    for _ in range(10):
        growth.step()
        batch = loader.sample()
        stacked = batch["observation"].numpy()  # [batch, 3, 2]: steps t-2 .. t of one episode
        uid = batch["info/episode_uid"].numpy()
        assert set(uid.tolist()) <= _live(loader.dataset) & growth.committed
        assert (stacked[..., 0] == uid[:, None]).all()
        step = stacked[:, -1, 1]
        assert (stacked[:, 0, 1] == np.maximum(step - 2, 0)).all()
        assert (batch["next/observation"].numpy()[:, -1, 1] == step + 1).all()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_a_device_loader_refreshes_on_the_host_then_copies(growth: Growth, sampler: str) -> None:
    loader = rlds_cli.Loader(
        "grow", batch_size=16, seed=6, refresh=1, sampler=sampler, keys=KEYS, in_memory="device", device="cpu"
    )
    first = loader.source
    for _ in range(8):
        growth.step()
        batch = loader.sample()
        assert isinstance(batch["observation"], torch.Tensor)
        check_rows({k: v.cpu().numpy() for k, v in batch.items()}, loader, growth.committed)
    assert loader.source is not first and loader.source is loader._device_source


def test_a_refresh_that_finds_nothing_changes_nothing(growth: Growth) -> None:
    loader = rlds_cli.Loader("grow", batch_size=8, seed=0, refresh=1, sampler="prioritized", keys=KEYS)
    sampler, source = loader.sampler, loader.source
    for _ in range(5):
        loader.sample()
    assert loader._refresher is not None and loader._refresher.rebuilds == 0
    assert loader.sampler is sampler and loader.source is source
    growth.step()
    loader.sample()
    assert loader._refresher.rebuilds == 1 and loader.sampler is sampler  # followed in place


def test_episode_ids_are_stable_across_refreshes_evictions_and_compactions(growth: Growth) -> None:
    ds = rlds_cli.open_dataset("grow")

    def ids() -> dict[int, int]:
        uids = ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"]
        assert (np.diff(ds.episode_ids) > 0).all()
        return dict(zip(uids.tolist(), ds.episode_ids.tolist(), strict=True))

    seen = ids()
    for round_ in range(3):
        for _ in range(4):
            growth.step()
        if round_ == 1:
            rlds_cli.compact("grow")
        ds.refresh()
        now = ids()
        assert all(seen[u] == now[u] for u in seen.keys() & now.keys())
        assert len(set(now.values())) == len(now)
        seen |= now
    fresh = rlds_cli.open_dataset("grow")
    assert np.array_equal(fresh.episode_ids, ds.episode_ids)


def test_view_change_maps_rows_by_episode_id() -> None:
    # old: episodes 10 (2 steps), 11 (3), 12 (1); new: 10 kept (protected), 11 evicted, 12, 13 (2)
    change = ViewChange(
        np.array([10, 11, 12]), np.array([2, 3, 1]), np.array([10, 12, 13]), np.array([2, 1, 2])
    )
    assert not change.appended_only and change.num_steps == 5
    assert change.map_rows(np.arange(6)).tolist() == [0, 1, -1, -1, -1, 2]
    assert change.carry(np.arange(6.0), -1.0).tolist() == [0.0, 1.0, 5.0, -1.0, -1.0]
    grown = ViewChange(np.array([1, 2]), np.array([2, 2]), np.array([1, 2, 3]), np.array([2, 2, 1]))
    assert grown.appended_only and grown.map_rows(np.array([3, 0])).tolist() == [3, 0]
    assert grown.carry(np.array([1, 2, 3, 4]), 9).tolist() == [1, 2, 3, 4, 9]
    gone = ViewChange(np.array([1]), np.array([2]), np.array([5]), np.array([3]))
    assert (
        gone.map_rows(np.array([0, 1])).tolist() == [-1, -1]
        and gone.carry(np.ones(2), 0.5).tolist() == [0.5] * 3
    )


@pytest.mark.parametrize("sampler", ["epoch", "prioritized"])
def test_epoch_and_prioritized_refresh_refuse_prefetch(growth: Growth, sampler: str) -> None:
    with pytest.raises(ValueError, match="needs prefetch=0"):
        rlds_cli.Loader("grow", batch_size=4, seed=0, refresh=1, sampler=sampler, prefetch=2)


@pytest.mark.parametrize("sampler", ["uniform", "slice"])
def test_a_prefetching_loader_that_refreshed_closes_and_goes_on(growth: Growth, sampler: str) -> None:
    options = {"slice_len": 2} if sampler == "slice" else {}
    loader = rlds_cli.Loader(
        "grow", batch_size=8, seed=0, refresh=1, sampler=sampler, prefetch=2, keys=KEYS, **options
    )
    for _ in range(6):
        growth.step()
        batch = loader.sample()
        # a prefetched batch may come from the view before the last commits: committed rows all
        assert set(batch["info/episode_uid"].numpy().ravel().tolist()) <= growth.committed
    loader.close()  # the queue's first batch put back: its generator state, over the new view
    growth.step()
    check_rows(loader.sample(), loader, growth.committed)
    loader.close()


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_a_refresh_after_the_dataset_was_replaced_says_so(isolated_cache: Path, storage: str) -> None:
    growth = Growth("grow", storage)
    ds = rlds_cli.open_dataset("grow")
    assert ds.manifest.backend == storage
    assert ds.refresh() is False  # nothing new: the one-stat path
    growth.close()
    shutil.rmtree(ds.directory)
    with rlds_cli.DatasetWriter("grow", storage=storage) as w:  # the same name, a new dataset
        for uid in range(5):  # as many commits as the old one had: a log of the same size
            w.add_episode(uid_episode(uid, 3))
            w.flush()
    assert (ds.directory / COMMIT_LOG_FILE).stat().st_size == ds.log_position
    with pytest.raises(DatasetReplacedError):
        ds.refresh()
