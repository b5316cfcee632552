"""Safe defaults of the loader library and of preprocess chunking (issue 17 items 3, 8, 9;
issue 16 point 3 in one process; the torchrun test is test_distributed_loader.py)."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlds_cli import preprocess
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.derive import split_dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import LoaderStateError, SeedError
from rlds_cli.inspection.summary import describe
from rlds_cli.loader import (
    EpochBatchSampler,
    EpochSampler,
    Loader,
    MixtureLoader,
    Normalize,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SliceSampler,
    TedIterableDataset,
    TedMapDataset,
    UniformSampler,
    compute_stats,
)
from rlds_cli.loader.data_loader import TedDataLoader
from rlds_cli.loader.device import DeviceUniformSampler
from rlds_cli.preprocess.plan import make_plan
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl
from tests.loader_fixtures import TedFactory

LENGTHS = [40, 13, 77, 5, 64, 1, 50]  # 250 steps
N = sum(LENGTHS)


@pytest.fixture(autouse=True)
def no_seed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLDS_SEED", raising=False)


@pytest.fixture
def ds(ted_dataset: TedFactory, isolated_cache: Path) -> Dataset:
    return ted_dataset(LENGTHS, root=isolated_cache)  # in the cache root: names resolve there


def _idx(batches: list[Any]) -> list[int]:
    return np.concatenate([np.asarray(b["index"]).ravel() for b in batches]).tolist() if batches else []


# --------------------------------------------------------------------------- 17.3: finite epochs


def test_plain_iteration_is_one_epoch_with_a_length(ds: Dataset) -> None:
    loader = Loader(ds, 32, keys=[])  # the default sampler: uniform, with replacement
    assert len(loader) == loader.batches_per_epoch == math.ceil(N / 32)
    batches = list(loader)  # ends
    assert len(batches) == len(loader)
    assert len(list(Loader(ds, 32, keys=[], epochs=3))) == 3 * math.ceil(N / 32)
    assert list(Loader(ds, 32, keys=[], epochs=0)) == []
    slices = Loader(ds, 30, keys=[], sampler="slice", slice_len=5)
    assert len(slices) == math.ceil(N / 30) == len(list(slices))
    epoch = Loader(ds, 32, keys=[], sampler="epoch", seed=1, epochs=2)
    got = _idx(list(epoch))
    assert len(got) == 2 * N and sorted(got[:N]) == sorted(got[N:]) == list(range(N))
    with pytest.raises(ValueError, match="epochs"):
        Loader(ds, 32, epochs=-1)


def test_endless_only_when_asked(ds: Dataset) -> None:
    loader = Loader(ds, 32, keys=[], epochs=None)
    with pytest.raises(TypeError, match="endless"):
        len(loader)
    assert len(list(itertools.islice(loader, 20))) == 20  # > one epoch's 8 batches
    assert len(list(itertools.islice(Loader(ds, 32, keys=[]).stream(), 20))) == 20


def test_a_resumed_pass_ends_with_its_epoch(ds: Dataset) -> None:
    loader = Loader(ds, 32, keys=[], seed=4)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    assert len(first) + len(rest) == len(loader)
    again = Loader(ds, 32, keys=[], seed=99)
    again.load_state_dict(state)
    assert _idx(list(again)) == _idx(rest)  # the rest of the epoch, no more


@pytest.mark.parametrize("sampler", ["epoch", "uniform"])
def test_a_checkpoint_at_an_epoch_end_resumes_with_the_next_epoch(ds: Dataset, sampler: str) -> None:
    loader = Loader(ds, 64, keys=[], sampler=sampler, seed=6)
    inside = None
    for _ in loader:
        inside = loader.state_dict()  # taken in the loop: the last one after the epoch's last batch
    after = loader.state_dict()  # taken after the loop
    epoch1 = _idx(list(loader))
    for state, passes in [(inside, [[], epoch1]), (after, [epoch1])]:
        resumed = Loader(ds, 64, keys=[], sampler=sampler, seed=1)
        resumed.load_state_dict(state)
        # a loop resumed inside epoch 0 finishes it (nothing left), then runs epoch 1
        assert [_idx(list(resumed)) for _ in passes] == passes


# --------------------------------------------------------------------------- 17.3: run seeds


def test_default_seed_is_fresh_logged_and_reproducible(ds: Dataset, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rlds_cli.loader"):
        a, b = Loader(ds, 32, keys=[]), Loader(ds, 32, keys=[])
    assert a.seed != b.seed
    assert f"seed {a.seed}" in caplog.text and f"seed={a.seed}" in caplog.text
    first = a.sample()["index"].tolist()
    assert first != b.sample()["index"].tolist()
    assert Loader(ds, 32, keys=[], seed=a.seed).sample()["index"].tolist() == first
    assert a.state_dict()["seed"] == a.seed
    # the samplers and adapters too
    assert UniformSampler(N, 8).seed != UniformSampler(N, 8).seed
    assert TedIterableDataset(ds, 8).seed != TedIterableDataset(ds, 8).seed


def test_seed_from_the_environment(ds: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLDS_SEED", "1234")
    assert Loader(ds, 8).seed == 1234 and EpochBatchSampler(N, 8, world_size=2, rank=1).seed == 1234
    monkeypatch.setenv("RLDS_SEED", "soon")
    with pytest.raises(SeedError, match="RLDS_SEED='soon'"):
        Loader(ds, 8)


def test_ranks_that_cannot_agree_on_a_seed_are_refused(ds: Dataset) -> None:
    with pytest.raises(SeedError, match=r"world_size=2 outside torch\.distributed"):
        Loader(ds, 8, sampler="epoch", rank=0, world_size=2)
    with pytest.raises(SeedError):
        EpochBatchSampler(N, 8, rank=1, world_size=2)
    with pytest.raises(SeedError):
        TedIterableDataset(ds, 8, rank=1, world_size=2)
    # with replacement, each rank's stream comes from (seed, rank): a fresh seed per rank is fine
    assert Loader(ds, 8, rank=1, world_size=2).seed is not None


def test_one_seed_gives_each_rank_its_own_stream(ds: Dataset) -> None:
    def stream(**kw: Any) -> list[int]:
        return Loader(ds, 16, keys=[], seed=5, **kw).sample()["index"].tolist()

    assert stream(rank=0, world_size=2) != stream(rank=1, world_size=2)
    assert stream(rank=0, world_size=2) == stream(rank=0, world_size=2)
    # a single process keeps the seed's own stream (older seeded runs are unchanged)
    assert stream() == UniformSampler(N, 16, seed=5).sample().tolist()


# --------------------------------------------------------------------------- 16.3: ranks


@pytest.fixture
def fake_rank_1_of_2(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """torch.distributed as torchrun's rank 1 of 2 sees it; the broadcast delivers rank 0's seed."""
    dist = torch.distributed
    calls: list[int] = []

    def broadcast(box: list[Any], src: int = 0) -> None:
        calls.append(src)
        box[0] = 777

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    return calls


def test_loader_takes_rank_and_world_from_torch_distributed(ds: Dataset, fake_rank_1_of_2: list[int]) -> None:
    loader = Loader(ds, 16, keys=[], sampler="epoch")
    assert (loader.rank, loader.world_size) == (1, 2)
    assert loader.seed == 777 and fake_rank_1_of_2 == [0]  # rank 0's seed, broadcast
    got = _idx(list(loader))
    want = EpochSampler(N, N, seed=777, rank=1, world_size=2).sample().tolist()
    assert got == want and len(got) == N // 2
    explicit = Loader(ds, 16, keys=[], sampler="epoch", seed=3, rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1) and len(_idx(list(explicit))) == N
    assert TedIterableDataset(ds, 8).rank == 1 and EpochBatchSampler(N, 8).world_size == 2


def _states(ds: Dataset, rank: int, world: int) -> list[tuple[str, Any, Any]]:
    """(name, a state saved by rank/world, a fresh object of rank 0 of 2)."""
    lengths = ds.episodes["length"]
    out = []
    for name, make in [
        ("UniformSampler", lambda r, w: UniformSampler(N, 4, 1, rank=r, world_size=w)),
        ("EpochSampler", lambda r, w: EpochSampler(N, 4, 1, rank=r, world_size=w)),
        ("SliceSampler", lambda r, w: SliceSampler(lengths, 2, 3, seed=1, rank=r, world_size=w)),
        ("PrioritizedSampler", lambda r, w: PrioritizedSampler(N, 4, seed=1, rank=r, world_size=w)),
        ("PrioritizedSliceSampler",
         lambda r, w: PrioritizedSliceSampler(lengths, 2, 3, seed=1, rank=r, world_size=w)),
        ("DeviceUniformSampler",
         lambda r, w: DeviceUniformSampler(N, 4, 1, torch.device("cpu"), rank=r, world_size=w)),
        ("EpochBatchSampler", lambda r, w: EpochBatchSampler(N, 4, seed=1, rank=r, world_size=w)),
        ("TedIterableDataset", lambda r, w: TedIterableDataset(ds, 4, seed=1, rank=r, world_size=w)),
        ("Loader", lambda r, w: Loader(ds, 4, seed=1, rank=r, world_size=w, sampler="epoch")),
        ("MixtureLoader", lambda r, w: MixtureLoader([ds], [1.0], 4, seed=1, rank=r, world_size=w)),
    ]:  # fmt: skip
        out.append((name, make(rank, world).state_dict(), make(0, 2)))
    return out


def test_every_state_checks_rank_and_world_size(ds: Dataset) -> None:
    for rank, world in [(1, 2), (0, 1), (0, 3)]:
        for name, state, target in _states(ds, rank, world):
            with pytest.raises(LoaderStateError, match=f"rank {rank} of {world}"):
                target.load_state_dict(state)
            assert name
    for _, state, target in _states(ds, 0, 2):
        target.load_state_dict(state)  # its own rank and world size: accepted


def test_num_batches_is_per_pass_whatever_the_workers(ds: Dataset) -> None:
    it = TedIterableDataset(ds, 8, keys=[], shuffle="uniform", seed=2, num_batches=20)
    alone = _idx(list(it))
    it.set_epoch(0)
    for workers in (1, 2):
        loader = TedDataLoader(it, num_workers=workers, multiprocessing_context="fork")
        it.set_epoch(0)
        got = list(loader)
        assert len(got) == 20 == len(it) and _idx(got) == alone  # the same stream
    with pytest.raises(ValueError, match="num_batches applies to shuffle='uniform'"):
        TedIterableDataset(ds, 8, num_batches=3)


def _resume_through(
    make: Any, take: int, workers: int, persistent: bool = False
) -> tuple[list[int], list[int]]:
    """Take ``take`` batches through a TedDataLoader, checkpoint, resume in fresh objects:
    (indices of the whole run, indices of one uninterrupted pass)."""
    ref = _idx(list(make(0)))
    loader = make(workers, persistent)
    it = iter(loader)
    seen = _idx([next(it) for _ in range(take)])
    state = loader.state_dict()
    del it, loader  # the "kill": workers and prefetched batches are gone
    resumed = make(workers, persistent)
    resumed.load_state_dict(state)
    return seen + _idx(list(resumed)), ref


def test_exact_resume_with_dataloader_workers(ds: Dataset) -> None:
    def iterable(workers: int, persistent: bool = False) -> TedDataLoader:
        data = TedIterableDataset(ds, 16, keys=[], seed=8)
        kw = {"multiprocessing_context": "fork", "persistent_workers": persistent} if workers else {}
        return TedDataLoader(data, num_workers=workers, **kw)

    def mapped(workers: int, persistent: bool = False) -> TedDataLoader:
        sampler = EpochBatchSampler(N, 16, seed=8)
        kw = {"multiprocessing_context": "fork", "prefetch_factor": 4} if workers else {}
        return TedDataLoader(TedMapDataset(ds, keys=[]), batch_sampler=sampler, num_workers=workers, **kw)

    for make in (iterable, mapped):
        for workers, take in [(0, 5), (2, 5), (2, 6)]:
            got, ref = _resume_through(make, take, workers)
            assert got == ref, (make.__name__, workers, take)  # no repeat, no gap, same order
            assert sorted(got) == list(range(N))


def test_persistent_workers_follow_the_loader(ds: Dataset) -> None:
    data = TedIterableDataset(ds, 16, keys=[], seed=3)
    loader = TedDataLoader(data, num_workers=2, multiprocessing_context="fork", persistent_workers=True)
    epoch0 = []
    for batch in loader:  # a pass broken off after 4 batches
        epoch0.append(batch)
        if len(epoch0) == 4:
            break
    epoch0 += list(loader)  # the rest of epoch 0 (the workers are restarted there)
    epoch1 = list(loader)  # a whole epoch 1, from the same persistent workers
    assert sorted(_idx(epoch0)) == sorted(_idx(epoch1)) == list(range(N))
    assert _idx(epoch0) != _idx(epoch1) and data.state_dict()["epoch"] == 2


def test_set_epoch_keeps_a_restored_position(ds: Dataset) -> None:
    sampler = EpochBatchSampler(N, 16, seed=2)
    it = iter(sampler)
    head = [next(it) for _ in range(3)]
    state = sampler.state_dict()
    fresh = EpochBatchSampler(N, 16, seed=5)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)  # the usual call at the top of the epoch loop keeps the position
    rest = list(fresh)
    assert sorted(itertools.chain(*head, *rest)) == list(range(N)) and len(head) + len(rest) == len(fresh)
    assert (fresh.epoch, fresh.position) == (1, 0)  # the finished pass moved on to epoch 1
    fresh.set_epoch(0)  # another epoch: from its start
    assert (fresh.epoch, fresh.position) == (0, 0) and len(list(fresh)) == len(fresh)


def test_mixture_iteration_is_an_explicit_choice(ds: Dataset) -> None:
    mix = MixtureLoader([ds], [1.0], batch_size=8)
    with pytest.raises(TypeError, match="num_batches"):
        iter(mix)
    assert len(list(itertools.islice(mix.stream(), 3))) == 3
    assert len(list(MixtureLoader([ds], [1.0], batch_size=8, num_batches=4))) == 4
    assert MixtureLoader([ds], [1.0]).seed != mix.seed


# --------------------------------------------------------------------------- 17.8: statistics


def test_normalize_accepts_load_stats(ds: Dataset) -> None:
    preprocess.run("ted", "tests.preprocess_fns:identity", "ted-stats", workers=1, stats=True)
    stored = open_dataset("ted-stats")
    shipped = preprocess.load_stats(stored)
    norm = Normalize(stats=shipped)  # the KeyStats mapping, as returned
    loader = Loader(stored, 16, seed=1, transform=norm, keys=["observation"])
    raw = Loader(stored, 16, seed=1, keys=["observation"]).sample()["observation"].numpy()
    s = shipped["observation"]
    want = (raw - s.mean.astype(np.float32)) / (s.std.astype(np.float32) + np.float32(1e-6))
    np.testing.assert_allclose(loader.sample()["observation"].numpy(), want, rtol=1e-6)
    assert set(norm.stats or {}) == {"observation"}  # only observations by default, not rewards
    with pytest.raises(ValueError, match="no entry for \\['observation'\\]"):
        Normalize(stats={"action": {"mean": 0.0, "std": 1.0}})


def test_views_are_normalized_with_their_parents_statistics(ds: Dataset) -> None:
    split_dataset("ted", 0.3)
    train, val = open_dataset("ted-train"), open_dataset("ted-val")
    parent = compute_stats(ds)["observation"]
    own = compute_stats(val)["observation"]
    assert not np.allclose(parent["mean"], own["mean"])
    default = Normalize()
    Loader(val, 8, transform=default)
    assert default.statistics is not None
    np.testing.assert_array_equal(default.statistics.mean["observation"], parent["mean"])
    assert default.source == "dataset 'ted' (the parent of view 'ted-val')"
    itself = Normalize(stats="self")
    Loader(val, 8, transform=itself)
    assert itself.statistics is not None
    np.testing.assert_array_equal(itself.statistics.mean["observation"], own["mean"])
    training = Normalize(stats=train)
    Loader(val, 8, transform=training)
    train_mean = compute_stats(train)["observation"]["mean"]
    assert training.statistics is not None
    np.testing.assert_array_equal(training.statistics.mean["observation"], train_mean)
    with pytest.raises(ValueError, match="stats must be"):
        Normalize(stats="train")


def test_inspect_and_normalize_agree(isolated_cache: Path) -> None:
    # rewards near 3e6 with a std below 1: a sum of squares loses it, the shared accumulator not
    isolated_cache.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = 3000
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    rewards = (3e6 + rng.integers(-4, 5, n) * 0.25).astype(np.float32)
    terminals = np.zeros(n, bool)
    terminals[[999, 1999, n - 1]] = True
    timeouts = np.zeros(n, bool)
    src = write_d4rl(
        isolated_cache / "big.hdf5",
        observations=obs,
        actions=obs[:, :1],
        rewards=rewards,
        terminals=terminals,
        timeouts=timeouts,
    )
    convert(src, "big", format="d4rl")
    big = open_dataset("big")
    shown = describe(big)["stored"]["next/reward"]["stats"]  # what `rlds inspect` prints
    used = compute_stats(big, ["next/reward"])["next/reward"]  # what Normalize uses
    exact = rewards.astype(np.float64)
    assert shown["mean"] == pytest.approx(exact.mean(), rel=1e-12)
    assert shown["std"] == pytest.approx(exact.std(), rel=1e-9)
    # Normalize's statistics are inspect's (a sum of squares was 2e-3 off)
    assert used["mean"][0] == shown["mean"] and used["std"][0] == shown["std"]


# --------------------------------------------------------------------------- 17.9: preprocess chunks


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30), chunk=st.integers(1, 50))
def test_step_chunks_end_on_episode_ends_when_episodes_fit(lengths: list[int], chunk: int) -> None:
    index = np.zeros(len(lengths), [("start", np.int64), ("length", np.int64)])
    index["length"] = lengths
    index["start"] = np.cumsum(lengths) - lengths
    ends = set((index["start"] + index["length"]).tolist())
    for whole in (False, True):
        plan = make_plan(index, "step", chunk, None, whole_episodes=whole)
        bounds = plan.bounds.tolist()
        assert bounds[0] == 0 and bounds[-1] == sum(lengths) and bounds == sorted(set(bounds))
        for a, b in itertools.pairwise(bounds):
            inside = [e for e in ends if a < e <= a + chunk]
            if b in ends:
                if not whole or inside:
                    assert b - a <= chunk and b == max(inside)  # the last episode end that fits
            else:  # a cut: only inside an episode longer than a chunk, never when whole
                assert not whole and b - a == chunk and not inside


def rtg_whole(batch: Any) -> Any:
    """Undiscounted returns-to-go; needs whole episodes (declared with the attribute)."""
    out = dict(batch)
    reward = batch["next/reward"].reshape(-1).astype(np.float64)
    rtg = np.zeros_like(reward)
    start = 0
    for end in np.flatnonzero(batch["next/done"].reshape(-1)):
        rtg[start : end + 1] = np.cumsum(reward[start : end + 1][::-1])[::-1]
        start = end + 1
    out["return_to_go"] = rtg[:, None]
    return out


rtg_whole.rlds_needs_whole_episodes = True  # type: ignore[attr-defined]


def rtg_plain(batch: Any) -> Any:
    return rtg_whole(batch)


def _true_rtg(ds: Dataset) -> np.ndarray:
    reward = ds.gather(np.arange(len(ds)), ["next/reward"])["next/reward"].reshape(-1).astype(np.float64)
    out = np.zeros_like(reward)
    for start, length in zip(ds.episodes["start"], ds.episodes["length"], strict=True):
        out[start : start + length] = np.cumsum(reward[start : start + length][::-1])[::-1]
    return out


def test_episode_wise_functions_get_whole_episodes_by_step(ds: Dataset) -> None:
    truth = _true_rtg(ds)
    # every episode fits in 80 steps: plain step chunks already end on episode ends
    preprocess.run("ted", rtg_plain, "fits", workers=1, chunk_steps=80)
    got = open_dataset("fits").gather(np.arange(N), ["return_to_go"])["return_to_go"].ravel()
    np.testing.assert_allclose(got, truth)
    # 30-step chunks cut the 40, 77, 64 and 50-step episodes, unless the function says so
    preprocess.run("ted", rtg_plain, "cut", workers=1, chunk_steps=30)
    cut = open_dataset("cut").gather(np.arange(N), ["return_to_go"])["return_to_go"].ravel()
    assert not np.allclose(cut, truth)
    result = preprocess.run("ted", rtg_whole, "whole", workers=2, chunk_steps=30)
    got = open_dataset("whole").gather(np.arange(N), ["return_to_go"])["return_to_go"].ravel()
    np.testing.assert_allclose(got, truth)
    assert result.num_chunks >= 5
    decorated = preprocess.whole_episodes(rtg_plain)
    assert decorated is rtg_plain and rtg_plain.rlds_needs_whole_episodes is True  # type: ignore[attr-defined]
    del rtg_plain.rlds_needs_whole_episodes  # type: ignore[attr-defined]


def test_a_script_without_main_guard_gets_a_clear_error(ds: Dataset, tmp_path: Path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent(
            """
            from rlds_cli import preprocess
            from rlds_cli.errors import PreprocessError

            try:
                preprocess.run("ted", "tests.preprocess_fns:identity", "copy", workers=2, chunk_steps=30)
            except PreprocessError as exc:
                print("ERROR", exc.message, "HINT", exc.hint)
            else:
                print("DONE")
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERROR the script that called preprocess.run has no main guard"), out.stdout
    assert 'if __name__ == "__main__":' in out.stdout and "workers=1" in out.stdout
    assert "a worker process died" not in out.stdout


@pytest.mark.parametrize("kind", ["mapped", "iterable"])
def test_dataloader_resumes_at_another_world_size(ds: Dataset, kind: str) -> None:
    """Two ranks' TedDataLoaders stop at different batches; three go on from both states (one
    with workers): every step of the epoch once, but DistributedSampler's padding."""

    def make(rank: int, world: int, workers: int = 0) -> TedDataLoader:
        kw = {"multiprocessing_context": "fork"} if workers else {}
        if kind == "iterable":
            data = TedIterableDataset(ds, 16, keys=[], seed=4, rank=rank, world_size=world)
            return TedDataLoader(data, num_workers=workers, **kw)
        sampler = EpochBatchSampler(N, 16, seed=4, rank=rank, world_size=world)
        return TedDataLoader(TedMapDataset(ds, keys=[]), batch_sampler=sampler, num_workers=workers, **kw)

    seen: list[int] = []
    two = [make(r, 2) for r in range(2)]
    for taken, loader in zip((3, 5), two, strict=True):
        batches = iter(loader)
        seen += _idx([next(batches) for _ in range(taken)])
    states = [loader.state_dict() for loader in two]
    three = [make(r, 3, workers=2 if r == 0 else 0) for r in range(3)]
    rests = []
    for loader in three:
        loader.resume(states)
        rests.append(list(loader))
    assert len({len(rest) for rest in rests}) == 1  # every rank the same number of batches
    seen += _idx([b for rest in rests for b in rest])
    counts = collections.Counter(seen)
    assert set(counts) == set(range(N)) and sum(counts.values()) - N <= -(-N // 2) * 2 - N
    assert three[0].state_dict()["epoch"] == 1 and "history" not in three[0].state_dict()


def test_a_resumed_epoch_restores_in_dataloader_workers(ds: Dataset) -> None:
    """A TedIterableDataset state saved mid-way through a resumed epoch restores exactly, with
    workers (whose copies plan the resumed epoch again)."""

    def make(rank: int, world: int) -> TedIterableDataset:
        return TedIterableDataset(ds, 8, keys=[], seed=6, rank=rank, world_size=world)

    states = []
    for rank in range(3):
        data = make(rank, 3)
        _idx(list(itertools.islice(iter(data), 2 + rank)))
        states.append(data.state_dict())
    resumed = make(0, 2)
    resumed.resume(states)
    head = list(itertools.islice(iter(resumed), 2))
    state = resumed.state_dict()
    assert "history" in state
    rest_in_process = list(iter(resumed))
    again = make(0, 2)
    again.load_state_dict(state)
    spawned = pickle.loads(pickle.dumps(again))  # what a spawned worker gets: no sampler, the plan kept
    rest = list(TedDataLoader(again, num_workers=2, multiprocessing_context="fork"))
    assert _idx(rest) == _idx(rest_in_process) == _idx(list(spawned)) and _idx(head)


def test_draws_with_replacement_do_not_resume_at_another_world_size(ds: Dataset) -> None:
    data = TedIterableDataset(ds, 16, keys=[], seed=8, shuffle="uniform", num_batches=4)
    with pytest.raises(LoaderStateError, match="draws with replacement"):
        TedDataLoader(data).resume([data.state_dict()])


def _two_rank_states(ds: Dataset, **kw: Any) -> list[dict[str, Any]]:
    states = []
    for rank, taken in ((0, 2), (1, 5)):
        data = TedIterableDataset(ds, 16, keys=[], seed=4, rank=rank, world_size=2, **kw)
        _idx(list(itertools.islice(iter(data), taken)))
        states.append(data.state_dict())
    return states


def test_iterable_drop_last_resumes_in_whole_batches(ds: Dataset) -> None:
    states = _two_rank_states(ds, drop_last=True)
    sizes = set()
    for rank in range(3):
        data = TedIterableDataset(ds, 16, keys=[], seed=0, rank=rank, world_size=3, drop_last=True)
        data.resume(states)
        sizes |= {len(b["index"]) for b in data}
    assert sizes == {16}


def test_persistent_workers_start_again_after_a_resume(ds: Dataset) -> None:
    data = TedIterableDataset(ds, 16, keys=[], seed=4, rank=0, world_size=3)
    loader = TedDataLoader(data, num_workers=2, multiprocessing_context="fork", persistent_workers=True)
    list(loader)  # epoch 0 on live workers, which now wait at the start of epoch 1
    states = []
    for rank, taken in ((0, 2), (1, 5)):  # a run of two ranks, stopped in its epoch 1
        two = TedIterableDataset(ds, 16, keys=[], seed=4, rank=rank, world_size=2)
        two.set_epoch(1)
        _idx(list(itertools.islice(iter(two), taken)))
        states.append(two.state_dict())
    loader.resume(states)
    expected = TedIterableDataset(ds, 16, keys=[], seed=0, rank=0, world_size=3)
    expected.resume(states)
    assert _idx(list(loader)) == _idx(list(expected))


def test_resumed_states_refused_in_one_line_and_nothing_changed(ds: Dataset) -> None:
    states = _two_rank_states(ds)
    data = TedIterableDataset(ds, 16, keys=[], seed=0, rank=0, world_size=3)
    data.resume(states)
    _idx(list(itertools.islice(iter(data), 1)))
    good = data.state_dict()
    target = TedIterableDataset(ds, 16, keys=[], seed=9, rank=0, world_size=3)
    _idx(list(itertools.islice(iter(target), 4)))
    before = target.state_dict()
    for forged, match in [
        ({**good, "history": []}, "history"),
        ({**good, "steps": good["steps"] + 1}, "steps were taken"),
        ({**good, "position": 10**6}, "position"),
    ]:
        with pytest.raises(LoaderStateError, match=match):
            target.load_state_dict(forged)
        assert target.state_dict() == before  # a refused state leaves the cursor as it was
    with pytest.raises(LoaderStateError, match="list of every rank"):
        target.resume(None)  # type: ignore[arg-type]
    old = {k: v for k, v in states[0].items() if k not in ("rank", "world_size")}
    one = TedIterableDataset(ds, 16, keys=[], seed=4)  # a state from before ranks were kept
    one.resume([old])  # read as rank 0 of 1
    assert len(one) > 0
    uniform = TedIterableDataset(ds, 16, keys=[], seed=8, shuffle="uniform", num_batches=4)
    with pytest.raises(LoaderStateError, match="draws with replacement"):
        uniform.load_state_dict({**uniform.state_dict(), "history": []})
    with pytest.raises(LoaderStateError, match="position"):
        uniform.load_state_dict({**uniform.state_dict(), "history": [], "position": 99})


def test_no_length_warning_on_the_epoch_after_a_resumed_one(ds: Dataset) -> None:
    """A resumed epoch's pass is shorter than the next: torch's check of the yielded count
    against len() measures each pass against its own length."""
    import warnings

    states = _two_rank_states(ds)
    data = TedIterableDataset(ds, 16, keys=[], seed=0, rank=0, world_size=3)
    loader = TedDataLoader(data)
    loader.resume(states)
    resumed = len(loader)  # the usual `total = len(loader)` before the loop
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = [batch for batch in loader]  # not list(): it asks len() itself
        second = [batch for batch in loader]
    assert len(first) == resumed < len(second) == len(loader)
