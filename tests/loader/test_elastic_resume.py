"""Elastic resume (issue 42 item 5): a state saved at world size N resumes at world size M, also
after a rank died, with every step of the epoch seen exactly once overall; for the ``"blocks"``
and ``"epoch"`` samplers, by the sampler (``resume``) and by the Loader (a state holding every
rank's progress, or :func:`merge_states` of the ranks' own)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader import BlockSampler, EpochSampler, Loader, merge_states
from rlds_cli.loader.epoch import batches_for, next_batch_size, share_bounds
from rlds_cli.loader.torch_data import EpochBatchSampler


def _make(kind: str, lengths: np.ndarray, batch: int, rank: int, world: int, seed: int = 3) -> Any:
    if kind == "blocks":
        return BlockSampler(
            lengths, batch, seed, block_rows=40, shuffle_window=3, rank=rank, world_size=world
        )
    return EpochSampler(int(lengths.sum()), batch, seed, rank=rank, world_size=world)


def _padding(kind: str, n: int, world: int) -> int:
    """Steps an uninterrupted epoch of the "epoch" sampler repeats (DistributedSampler's padding)."""
    return 0 if kind == "blocks" else -(-n // world) * world - n


def _run_to_end(samplers: list[Any], seen: list[int]) -> None:
    counts = set()
    for s in samplers:
        k = 0
        while not s.epoch_done():
            seen.extend(s.sample().tolist())
            k += 1
        counts.add(k)
    assert len(counts) == 1  # every rank runs the same number of batches


@pytest.mark.parametrize("kind", ["blocks", "epoch"])
@pytest.mark.parametrize("case", range(30))
def test_n_to_m_to_k_each_step_once(kind: str, case: int) -> None:
    rng = np.random.default_rng(100 + case)
    lengths = rng.integers(1, 40, rng.integers(5, 80))
    n = int(lengths.sum())
    batch = int(rng.integers(1, 40))
    worlds = [int(w) for w in rng.integers(1, 7, 3)]
    seen: list[int] = []
    states: list[dict[str, Any]] | None = None
    for g, world in enumerate(worlds[:2]):
        ranks = [_make(kind, lengths, batch, r, world, seed=7 + g) for r in range(world)]
        if states is not None:
            for s in ranks:
                s.resume(states)
        left = ranks[0].batches_per_epoch  # at most a whole epoch's batches (the rest is less)
        for s in ranks:  # each rank stops at its own batch: a rank died, the others went on
            for _ in range(int(rng.integers(0, max(1, left)))):
                if not s.epoch_done():
                    seen.extend(s.sample().tolist())
        states = [s.state_dict() for s in ranks]
    last = [_make(kind, lengths, batch, r, worlds[2]) for r in range(worlds[2])]
    for s in last:
        s.resume(states)
    _run_to_end(last, seen)
    counts = Counter(seen)
    assert set(counts) == set(range(n))  # nothing missed
    assert sum(counts.values()) - n <= _padding(kind, n, worlds[0])  # nothing repeated but padding
    if kind == "blocks":
        assert max(counts.values()) == 1
    for s in last:  # the epoch is over; the next starts afresh at the new world size
        s.sample()
        assert s.epoch == (states[0]["epoch"] + 1) and not s.history  # type: ignore[index]


def test_batch_sizes_full_but_the_last_one_or_two() -> None:
    assert share_bounds(10, 3).tolist() == [0, 4, 7, 10]
    assert batches_for(0, 3, 8) == 0 and batches_for(17, 2, 8) == 2
    sizes = []
    left, k = 33, 3  # 33 steps for 3 batches of up to 16
    while k:
        sizes.append(next_batch_size(left, k, 16))
        left, k = left - sizes[-1], k - 1
    assert sizes == [16, 16, 1]
    assert [next_batch_size(32, 3, 16), next_batch_size(2, 3, 16), next_batch_size(0, 1, 16)] == [16, 1, 0]


def test_same_world_size_continues_each_ranks_own_order() -> None:
    lengths = np.full(30, 11)
    ranks = [_make("blocks", lengths, 8, r, 3) for r in range(3)]
    for s in ranks:
        s.sample()
    states = [s.state_dict() for s in ranks]
    for r in range(3):
        again = _make("blocks", lengths, 8, r, 3)
        again.load_state_dict(states[r])
        assert (again.sample() == ranks[r].sample()).all()


def test_resume_refuses_states_that_are_not_one_run() -> None:
    lengths = np.full(30, 11)
    ranks = [_make("blocks", lengths, 8, r, 2) for r in range(2)]
    ranks[1].sample()
    states = [s.state_dict() for s in ranks]
    target = _make("blocks", lengths, 8, 0, 1)
    before = target.state_dict()
    ahead = [states[0], {**states[1], "epoch": 1}]
    cases = [
        ([states[0]], r"ranks \[0\].*0\.\.1"),
        ([states[0], states[0]], r"ranks \[0, 0\]"),
        (ahead, "differ in 'epoch'"),
        ([states[0], {**states[1], "seed": 9}], "differ in 'seed'"),
        ([states[0], {**states[1], "position": 10**6}], "consumed 1000000 steps"),
        ([states[0], {**states[1], "position": -1}], "'position'"),
        ([], "non-empty list"),
    ]
    for bad, words in cases:
        with pytest.raises(LoaderStateError, match=words):
            target.resume(bad)
        assert target.state_dict() == before


def test_loader_merge_states_by_hand_two_ranks_to_three(ted_dataset: Any) -> None:
    lengths = [37, 80, 12, 55, 90, 26]
    ds = ted_dataset(lengths)
    n = sum(lengths)
    for sampler in ("blocks", "epoch"):
        extra = {"block_rows": 32, "shuffle_window": 2} if sampler == "blocks" else {}
        two = [
            Loader(ds, 16, sampler=sampler, seed=5, rank=r, world_size=2, keys=[], **extra) for r in range(2)
        ]
        seen: list[int] = []
        for r, loader in enumerate(two):
            for _ in range(3 + r):  # rank 0 died a batch earlier
                seen.extend(loader.sample()["index"].tolist())
        merged = merge_states([loader.state_dict() for loader in two])
        assert len(merged["ranks"]) == 2
        before = list(seen)
        three = [
            Loader(ds, 16, sampler=sampler, seed=1, rank=r, world_size=3, keys=[], **extra) for r in range(3)
        ]
        passes = []
        for loader in three:
            loader.load_state_dict(merged)
            passes.append([b["index"].tolist() for b in loader])  # the rest of the epoch
        assert len({len(p) for p in passes}) == 1
        seen.extend(i for p in passes for b in p for i in b)
        assert sorted(seen) == list(range(n)), sampler
        # the same world size, ranks that stopped apart: the rest is shared out again, so that
        # both run the same number of batches
        again = [
            Loader(ds, 16, sampler=sampler, seed=1, rank=r, world_size=2, keys=[], **extra) for r in range(2)
        ]
        rest = []
        for loader in again:
            loader.load_state_dict(merged)
            rest.append([i for b in loader for i in b["index"].tolist()])
        assert sorted(before + rest[0] + rest[1]) == list(range(n))
        assert len({-(-len(r) // 16) for r in rest}) == 1
        two[0].sample()  # now both ranks at batch 4: each continues its own order exactly
        level = merge_states([loader.state_dict() for loader in two])
        for r in range(2):
            own = Loader(ds, 16, sampler=sampler, seed=1, rank=r, world_size=2, keys=[], **extra)
            own.load_state_dict(level)
            assert own.sample()["index"].tolist() == two[r].sample()["index"].tolist()


def test_an_elastic_resume_with_no_whole_batch_left_ends_the_epoch_empty(ted_dataset: Any) -> None:
    """drop_last, 56 steps on 2 ranks, 3 of 4 batches each drawn, resumed on 3 ranks: the 14 steps
    left make no batch of 7 a rank. The resumed pass served 2 batches of the next epoch (every
    later epoch shifted by one); it is empty, and the pass after it is epoch 1, whole."""
    ds = ted_dataset([8] * 7)
    options: dict[str, Any] = {"sampler": "epoch", "drop_last": True, "seed": 1, "keys": []}
    two = [Loader(ds, 7, rank=r, world_size=2, **options) for r in range(2)]
    for loader in two:
        for _ in range(3):
            loader.sample()
    merged = merge_states([loader.state_dict() for loader in two])
    three = [Loader(ds, 7, rank=r, world_size=3, **options) for r in range(3)]
    for loader in three:
        loader.load_state_dict(merged)
        assert [b for b in loader] == [] and loader.sampler.epoch == 0  # type: ignore[attr-defined]
        assert len(list(loader)) == 56 // 3 // 7 and loader.sampler.epoch == 1  # type: ignore[attr-defined]


def test_loader_refuses_another_world_size_without_every_ranks_progress(ted_dataset: Any) -> None:
    ds = ted_dataset([40, 40])
    a = Loader(ds, 8, sampler="blocks", seed=5, rank=0, world_size=2, keys=[])
    b = Loader(ds, 8, sampler="blocks", seed=5, rank=0, world_size=1, keys=[])
    with pytest.raises(LoaderStateError, match="rank 0 of 2; this is rank 0 of 1") as refused:
        b.load_state_dict(a.state_dict())
    assert "merge_states" in str(refused.value.hint)
    u = [Loader(ds, 8, sampler="uniform", seed=5, rank=r, world_size=2, keys=[]) for r in range(2)]
    one = Loader(ds, 8, sampler="uniform", seed=5, rank=0, world_size=1, keys=[])
    with pytest.raises(LoaderStateError, match="rank 0 of 2; this is rank 0 of 1"):
        one.load_state_dict(merge_states([x.state_dict() for x in u]))  # no epoch to share out
    with pytest.raises(LoaderStateError, match=r"ranks \[1\]"):
        merge_states([u[1].state_dict()])
    merged = merge_states([a.state_dict(), Loader(ds, 8, sampler="blocks", seed=5, rank=1, world_size=2,
                                                  keys=[]).state_dict()])  # fmt: skip
    with pytest.raises(LoaderStateError, match="'ranks' must list"):
        b.load_state_dict({**merged, "ranks": merged["ranks"][:1]})
    with pytest.raises(LoaderStateError, match="non-empty list"):
        merge_states([])


def _take(sampler: EpochBatchSampler, batches: int, seen: list[int]) -> None:
    it = iter(sampler)
    for _ in range(batches):
        batch = next(it, None)
        if batch is None:
            return
        seen.extend(batch)


@pytest.mark.parametrize("case", range(30))
def test_epoch_batch_sampler_n_to_m_to_k_each_step_once(case: int) -> None:
    """The torch batch sampler resumes at other world sizes as EpochSampler does: every step of
    the epoch taken once over all ranks (DistributedSampler's padding of the first generation
    aside), every rank the same number of batches."""
    rng = np.random.default_rng(500 + case)
    n, batch = int(rng.integers(5, 400)), int(rng.integers(1, 40))
    worlds = [int(w) for w in rng.integers(1, 7, 3)]
    seen: list[int] = []
    states: list[dict[str, Any]] | None = None
    for world in worlds[:2]:
        ranks = [EpochBatchSampler(n, batch, seed=7, rank=r, world_size=world) for r in range(world)]
        for s in ranks:
            if states is not None:
                s.resume(states)
            _take(s, int(rng.integers(0, len(s) + 1)), seen)  # each rank stops at its own batch
        states = [s.state_dict() for s in ranks]
    last = [EpochBatchSampler(n, batch, seed=1, rank=r, world_size=worlds[2]) for r in range(worlds[2])]
    for s in last:
        s.resume(states)
    assert len({len(s) for s in last}) == 1  # every rank the same number of batches
    for s in last:
        _take(s, int(rng.integers(0, len(s) + 1)), seen)
        again = EpochBatchSampler(n, batch, seed=1, rank=s.rank, world_size=s.world_size)
        again.load_state_dict(s.state_dict())  # a resumed epoch's state restores at its world size
        rest, epoch = list(s), s.epoch - 1
        assert list(again) == rest and all(len(b) <= batch for b in rest)  # empty: fewer steps than batches
        seen.extend(step for b in rest for step in b)
        per_rank = -(-n // s.world_size)
        assert s.epoch == epoch + 1 and len(s) == -(-per_rank // batch)  # then a fresh epoch
    counts = Counter(seen)
    assert set(counts) == set(range(n))  # nothing missed
    assert sum(counts.values()) - n <= _padding("epoch", n, worlds[0])  # nothing repeated but padding


def test_epoch_batch_sampler_drop_last_resumes_in_whole_batches() -> None:
    ranks = [EpochBatchSampler(250, 16, seed=2, rank=r, world_size=2, drop_last=True) for r in range(2)]
    for taken, s in zip((2, 5), ranks, strict=True):
        _take(s, taken, [])
    states = [s.state_dict() for s in ranks]
    three = [EpochBatchSampler(250, 16, seed=0, rank=r, world_size=3, drop_last=True) for r in range(3)]
    for s in three:
        s.resume(states)
    rests = [list(s) for s in three]
    assert len({len(r) for r in rests}) == 1 and all(len(b) == 16 for r in rests for b in r)


def test_epoch_batch_sampler_refuses_states_that_do_not_resume() -> None:
    ranks = [EpochBatchSampler(250, 16, seed=2, rank=r, world_size=2) for r in range(2)]
    for s in ranks:
        _take(s, 3, [])
    states = [s.state_dict() for s in ranks]
    fresh = EpochBatchSampler(250, 16, seed=0, rank=0, world_size=3)
    with pytest.raises(LoaderStateError, match="rank"):
        fresh.resume(states[:1])  # rank 1's progress is missing
    with pytest.raises(LoaderStateError, match="batch_size=16, not 8"):
        EpochBatchSampler(250, 8, seed=0, rank=0, world_size=3).resume(states)
    fresh.resume(states)
    _take(fresh, 2, [])
    resumed = fresh.state_dict()
    assert "history" in resumed and resumed["steps"] == 32
    again = EpochBatchSampler(250, 16, seed=0, rank=0, world_size=3)
    with pytest.raises(LoaderStateError, match="steps"):
        again.load_state_dict({k: v for k, v in resumed.items() if k != "steps"})
    with pytest.raises(LoaderStateError, match="position"):
        again.load_state_dict({**resumed, "position": len(fresh) + 1})
    again.load_state_dict(resumed)
    assert list(again) == list(fresh)
    with pytest.raises(LoaderStateError, match="steps were taken"):
        again.load_state_dict({**resumed, "steps": 31})


@pytest.mark.parametrize("sampler", ["epoch", "blocks"])
def test_a_state_saved_after_the_loop_resumes_with_the_next_epoch_at_any_world_size(
    ted_dataset: Any, sampler: str
) -> None:
    """Saved after a ``for`` pass that finished epoch 0, restored at another world size: the next
    pass was empty (epoch 0 "ended" again), and a training loop lost an epoch without a word."""
    ds = ted_dataset([8] * 7)
    options: dict[str, Any] = {"sampler": sampler, "seed": 1, "keys": []}
    two = [Loader(ds, 7, rank=r, world_size=2, **options) for r in range(2)]
    for loader in two:
        assert len(list(loader)) == 4  # epoch 0, whole
    merged = merge_states([loader.state_dict() for loader in two])
    for world in (1, 2, 3):
        ranks = [Loader(ds, 7, rank=r, world_size=world, **options) for r in range(world)]
        seen = []
        for loader in ranks:
            loader.load_state_dict(merged)
            seen += [i for batch in loader for i in np.asarray(batch["index"]).tolist()]
            assert loader.sampler.epoch == 1  # type: ignore[attr-defined]
        assert sorted(set(seen)) == list(range(56)), world  # epoch 1 over the ranks, every step


def test_a_drop_last_epoch_every_rank_finished_resumes_with_the_next_epoch(ted_dataset: Any) -> None:
    """With ``drop_last``, the steps an epoch dropped (too few for a whole batch on each rank)
    were served after an elastic resume as an extra pass of the finished epoch: steps no
    uninterrupted run serves, and every later epoch one behind."""
    ds = ted_dataset([8] * 7)
    options: dict[str, Any] = {"sampler": "epoch", "seed": 1, "keys": [], "drop_last": True}
    two = [Loader(ds, 8, rank=r, world_size=2, **options) for r in range(2)]
    for loader in two:
        assert len(list(loader)) == 3  # 28 steps a rank: 3 whole batches, 4 dropped
    merged = merge_states([loader.state_dict() for loader in two])
    for world in (1, 2, 3):
        ranks = [Loader(ds, 8, rank=r, world_size=world, **options) for r in range(world)]
        for loader in ranks:
            loader.load_state_dict(merged)
            fresh = Loader(ds, 8, rank=loader.rank, world_size=world, **options)
            fresh.sampler.set_epoch(1)  # type: ignore[attr-defined]
            got = [np.asarray(b["index"]).tolist() for b in loader]
            assert got == [np.asarray(b["index"]).tolist() for b in fresh], world
            assert loader.sampler.epoch == 1  # type: ignore[attr-defined]


def test_a_drop_last_epoch_resumed_mid_way_still_owes_its_steps() -> None:
    """Only a finished generation ends the epoch: mid-way, the unconsumed steps are served."""
    ranks = [EpochSampler(56, 8, 1, drop_last=True, rank=r, world_size=2) for r in range(2)]
    served = [i for s in ranks for i in s.sample().tolist()]
    one = EpochSampler(56, 8, 1, drop_last=True)
    one.resume([s.state_dict() for s in ranks])
    while not one.epoch_done():
        served += one.sample().tolist()
    assert len(served) == len(set(served)) == 56  # 16 before, 40 after: 5 whole batches
    assert one.epoch == 0
