"""Mixtures over growing datasets (issue 25): readiness and renormalized weights, annealing,
fixed-ratio batches, refresh (new rows served, evicted rows never), exact resume.

Every row carries its episode's uid (``info/episode_uid``) and ``[uid, t]`` as its
observation, so a row of another episode, a torn row or an evicted episode shows.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.loader.mixture import MixtureLoader, MixtureSampler
from rlds_cli.loader.mixture_sampler import fixed_counts
from tests.dataset_fixtures import uid_episode
from tests.loader_fixtures import make_ted


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLDS_FSYNC", "0")
    yield


def _write(root: Path, name: str, uids: list[int], length: int = 10, **settings: object) -> None:
    with rlds_cli.DatasetWriter(name, root=root, mode="append", **settings) as w:  # type: ignore[arg-type]
        for uid in uids:
            w.add_episode(uid_episode(uid, length))


def _per_batch(mix: MixtureLoader) -> np.ndarray:
    """One batch; returns rows per source (and checks every row is its episode's own)."""
    batch = mix.sample()
    uid, obs = batch["info/episode_uid"].numpy(), batch["observation"].numpy()
    assert (obs[:, 0] == uid).all()
    return np.bincount(batch["source"].numpy(), minlength=len(mix.names))


def test_fixed_counts_rule() -> None:
    # floor of w * B, then one more row to the largest remainders (ties: the earlier member)
    assert fixed_counts(np.array([0.5, 0.5]), 256).tolist() == [128, 128]
    assert fixed_counts(np.array([0.25, 0.25, 0.5]), 7).tolist() == [2, 2, 3]
    assert fixed_counts(np.ones(3) / 3, 10).tolist() == [4, 3, 3]
    assert fixed_counts(np.array([0.0, 0.1, 0.9]), 3).tolist() == [0, 0, 3]
    assert fixed_counts(np.array([0.0, 1.0]), 5).tolist() == [0, 5]


def test_not_ready_member_weighs_zero_and_others_renormalize(tmp_path: Path) -> None:
    _write(tmp_path, "a", [1, 2, 3])
    _write(tmp_path, "b", [11, 12, 13])
    _write(tmp_path, "online", [100], min_size=30)  # 10 steps of 30: not ready
    mix = MixtureLoader(
        ["a", "b", "online"], [0.2, 0.3, 0.5], batch_size=10, root=tmp_path, seed=0, split="fixed", refresh=1
    )
    report = mix.report()
    assert [report[n]["weight"] for n in ("a", "b", "online")] == pytest.approx([0.4, 0.6, 0.0])
    assert report["online"]["ready"] == 0.0
    for _ in range(20):  # exactly 0.2 / 0.5 and 0.3 / 0.5 of every batch; online never
        assert _per_batch(mix).tolist() == [4, 6, 0]
    _write(tmp_path, "online", [101, 102])  # 30 steps: ready at the next batch
    for _ in range(5):
        assert _per_batch(mix).tolist() == [2, 3, 5]
    assert mix.report()["online"]["ready"] == 1.0
    assert mix.report()["online"]["rows"] == 25


def test_random_split_never_serves_a_member_not_ready(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1, 2])
    _write(tmp_path, "on", [100], min_size=1_000)
    mix = MixtureLoader({"off": "off", "on": "on"}, {"off": 1, "on": 9}, batch_size=64, root=tmp_path, seed=1)
    for _ in range(30):
        assert _per_batch(mix).tolist() == [64, 0]
    assert mix.report()["on"]["target"] == 0.0


def test_anneal_schedule(tmp_path: Path) -> None:
    """The written rule: a member first ready before batch b0 weighs w * min(1, (b - b0 + 1) / N)
    at batch b, then the weights are renormalized. Offline 0.5, online 0.5, N = 4, B = 40:
    online's share is 0.125/0.625, 0.25/0.75, 0.375/0.875, 0.5/1 -> 8, 13.3, 17.1, 20 rows."""
    _write(tmp_path, "off", [1, 2, 3])
    _write(tmp_path, "on", [100], min_size=20)
    mix = MixtureLoader(
        ["off", "on"], [0.5, 0.5], batch_size=40, root=tmp_path, seed=0, split="fixed", anneal=4, refresh=1
    )
    assert [_per_batch(mix)[1] for _ in range(3)] == [0, 0, 0]
    _write(tmp_path, "on", [101])  # ready from batch 3 on
    got = [_per_batch(mix)[1] for _ in range(6)]
    assert got == [8, 13, 17, 20, 20, 20]
    assert mix.sampler.ready_at.tolist() == [-1, 3]


def test_anneal_does_not_touch_members_ready_at_start(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    _write(tmp_path, "on", [100])
    mix = MixtureLoader(
        ["off", "on"], [0.5, 0.5], batch_size=8, root=tmp_path, seed=0, split="fixed", anneal=100
    )
    assert _per_batch(mix).tolist() == [4, 4]


def test_a_member_that_grows_gets_its_new_rows(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    _write(tmp_path, "on", [100])
    mix = MixtureLoader(
        ["off", "on"], [0.5, 0.5], batch_size=64, root=tmp_path, seed=3, split="fixed", refresh=1
    )
    mix.sample()
    _write(tmp_path, "on", [101], length=200)  # 200 of on's 210 steps
    batch = mix.sample()
    assert mix.source.sizes == [10, 210]
    online = batch["info/episode_uid"].numpy()[batch["source"].numpy() == 1]
    assert 101 in online.tolist()


def test_no_evicted_row_is_served(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1, 2])
    _write(tmp_path, "on", [100, 101], capacity=40)  # FIFO: 4 episodes of 10 steps at most
    mix = MixtureLoader(
        ["off", "on"], [0.25, 0.75], batch_size=64, root=tmp_path, seed=0, split="fixed", refresh=1
    )
    uid = 102
    for _ in range(10):
        _write(tmp_path, "on", [uid, uid + 1])
        uid += 2
        batch = mix.sample()
        ds = mix.datasets[1]
        live = set(ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"].tolist())
        assert live == set(range(uid - 4, uid))
        src, served = batch["source"].numpy(), batch["info/episode_uid"].numpy()
        assert set(served[src == 1].tolist()) <= live
        assert (batch["observation"].numpy()[:, 0] == served).all()
        assert mix.source.sizes[1] == 40


def test_refresh_every_n_batches(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    _write(tmp_path, "on", [100])
    mix = MixtureLoader(["off", "on"], [0.5, 0.5], batch_size=8, root=tmp_path, seed=0, refresh=3)
    mix.sample()
    _write(tmp_path, "on", [101])
    mix.sample()  # batch 2: not due
    assert mix.source.sizes == [10, 10]
    mix.sample()  # batch 3: refreshed before it was drawn
    assert mix.source.sizes == [10, 20]


def test_resume_is_exact(tmp_path: Path) -> None:
    """A restored mixture draws the same batches: the generator, when each member became ready
    (the anneal ramp) and the refresh count (which batch sees the next commit) are restored."""
    _write(tmp_path, "off", [1, 2, 3])
    _write(tmp_path, "on", [100], min_size=20)
    kw = {"batch_size": 16, "root": tmp_path, "anneal": 5, "refresh": 2}
    mix = MixtureLoader(["off", "on"], [0.5, 0.5], seed=7, **kw)  # type: ignore[arg-type]
    for _ in range(3):
        mix.sample()
    _write(tmp_path, "on", [101, 102])
    for _ in range(2):  # batch 4 refreshes: online is ready, annealing from batch 3
        mix.sample()
    state = pickle.loads(pickle.dumps(mix.state_dict()))  # 5 batches: the next one refreshes
    other = MixtureLoader(["off", "on"], [0.5, 0.5], seed=99, **kw)  # type: ignore[arg-type]
    other.load_state_dict(state)
    _write(tmp_path, "on", [103], length=100)  # seen by the next batch of both
    want = [(b["source"].tolist(), b["index"].tolist()) for b in (mix.sample() for _ in range(6))]
    got = [(b["source"].tolist(), b["index"].tolist()) for b in (other.sample() for _ in range(6))]
    assert got == want
    assert other.report() == mix.report()
    assert mix.source.sizes == other.source.sizes == [30, 130]


def test_a_state_saved_on_another_view_of_a_growing_source_is_refused(tmp_path: Path) -> None:
    """An eviction keeps a source's size and moves its rows: the state was accepted and the resumed
    mixture served episode 3 where the saved run served episode 2 (a single Loader refused)."""
    from rlds_cli.errors import LoaderStateError

    _write(tmp_path, "off", [100, 101], length=4)
    _write(tmp_path, "on", [1, 2, 3], length=4, capacity_episodes=3)
    kw = {"batch_size": 8, "seed": 0, "root": tmp_path}
    mix = MixtureLoader(["off", "on"], [0.5, 0.5], **kw)  # type: ignore[arg-type]
    mix.sample()
    state = pickle.loads(pickle.dumps(mix.state_dict()))
    again = MixtureLoader(["off", "on"], [0.5, 0.5], **kw)  # type: ignore[arg-type]
    again.load_state_dict(state)  # the same views: resumed
    _write(tmp_path, "on", [4], length=4, capacity_episodes=3)  # episode 1 evicted: 12 steps still
    moved = MixtureLoader(["off", "on"], [0.5, 0.5], **kw)  # type: ignore[arg-type]
    with pytest.raises(
        LoaderStateError,
        match=r"saved on a view as of commit-log byte [0-9]+; this MixtureLoader reads growing source 'on'",
    ):
        moved.load_state_dict(state)
    bad = {**state, "views": [1]}
    with pytest.raises(LoaderStateError, match="'views' must be a mapping"):
        moved.load_state_dict(bad)


def test_a_member_created_with_a_schema_and_no_steps(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    schema = rlds_cli.open_dataset("off", root=tmp_path).fields
    _write(tmp_path, "on", [], schema=schema)
    mix = MixtureLoader(
        ["off", "on"], [0.5, 0.5], batch_size=8, root=tmp_path, seed=0, split="fixed", refresh=1
    )
    assert mix.source.sizes == [10, 0]
    assert _per_batch(mix).tolist() == [8, 0]
    _write(tmp_path, "on", [100])
    assert _per_batch(mix).tolist() == [4, 4]


def test_bad_arguments(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    _write(tmp_path, "on", [100], min_size=50)
    with pytest.raises(ValueError, match="split must be one of"):
        MixtureLoader(["off", "on"], [1, 1], root=tmp_path, split="half")
    with pytest.raises(ValueError, match="anneal must be a number of batches"):
        MixtureLoader(["off", "on"], [1, 1], root=tmp_path, anneal=0)
    with pytest.raises(ValueError, match="refresh must be a number of batches"):
        MixtureLoader(["off", "on"], [1, 1], root=tmp_path, refresh=0)
    with pytest.raises(ValueError, match=r"weights name unknown source\(s\) \['online'\]"):
        MixtureLoader(["off", "on"], {"off": 1, "online": 1}, root=tmp_path)
    with pytest.raises(ValueError, match="sizes must be one non-negative count per source"):
        MixtureSampler([10, 10], [1, 1], 8, seed=0).set_sizes([10], [True])
    only_on = MixtureLoader(["off", "on"], [0, 1], root=tmp_path, seed=0)
    with pytest.raises(ValueError, match="no dataset of the mixture is ready"):
        only_on.sample()
    static = make_ted(tmp_path, "static", [10, 20])
    with pytest.raises(ValueError, match="refresh= follows growing datasets"):
        MixtureLoader({"s1": static, "s2": static}, [1, 1], refresh=1)


def test_a_member_whose_schema_differs(tmp_path: Path) -> None:
    _write(tmp_path, "off", [1])
    t = np.arange(11, dtype=np.float32)
    with rlds_cli.DatasetWriter("on", root=tmp_path, mode="append") as w:
        episode = uid_episode(100, 10)
        episode["observation"] = np.stack([t, t, t], axis=1)[:-1]
        episode["next/observation"] = np.stack([t, t, t], axis=1)[1:]
        w.add_episode(episode)
    with pytest.raises(ValueError, match=r"key 'observation' is .* in source 'on' but .* in 'off'"):
        MixtureLoader(["off", "on"], [0.5, 0.5], root=tmp_path, seed=0)
