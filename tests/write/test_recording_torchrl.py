"""TorchRL interop: a real collector's rollouts (``GymEnv("CartPole-v1")``, one env and two)
cut into whole episodes by :class:`RolloutEpisodes`, episodes joined across batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

from rlds_cli.errors import RecordingError  # noqa: E402
from rlds_cli.recording.torchrl import RolloutEpisodes, from_rollout  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def _collector(n_envs: int, frames: int, total: int, seed: int = 0, **options: Any) -> Any:
    from torchrl.envs import GymEnv, SerialEnv

    try:
        from torchrl.collectors import Collector
    except ImportError:  # torchrl < 0.14 names it SyncDataCollector
        from torchrl.collectors import SyncDataCollector as Collector
    env = GymEnv("CartPole-v1") if n_envs == 1 else SerialEnv(n_envs, lambda: GymEnv("CartPole-v1"))
    env.set_seed(seed)
    torch.manual_seed(seed)  # the collector's random policy draws from torch's generator
    return Collector(env, None, frames_per_batch=frames, total_frames=total, **options)


def _reference(batches: list[Any], env: int | None) -> list[dict[str, np.ndarray]]:
    """The whole stream of one env, concatenated in time and cut after every next/done."""
    stream = torch.cat([b if env is None else b[env] for b in batches], 0)
    done = stream["next", "done"].squeeze(-1).numpy()
    ends = np.flatnonzero(done) + 1
    out = []
    for start, stop in zip([0, *ends[:-1]], ends, strict=True):
        piece = stream[int(start) : int(stop)]
        out.append(
            {
                "observation": piece["observation"].numpy(),
                "next/observation": piece["next", "observation"].numpy(),
                "action": piece["action"].numpy(),
                "next/reward": piece["next", "reward"].numpy(),
            }
        )
    return out


def _check_episode(ep: dict[str, np.ndarray]) -> None:
    """TED invariants of one whole episode."""
    t = len(ep["next/reward"])
    assert ep["next/reward"].shape == (t, 1) and ep["next/done"].shape == (t, 1)
    assert ep["next/done"][:-1].sum() == 0 and bool(ep["next/done"][-1, 0])
    assert np.array_equal(ep["observation"][1:], ep["next/observation"][:-1])
    assert np.abs(ep["observation"][0]).max() <= 0.05  # CartPole's reset state
    assert not any(k.startswith("collector") for k in ep)
    assert set(ep) >= {"observation", "next/observation", "action", "next/terminated", "next/truncated"}
    assert "done" not in ep and "terminated" not in ep


@pytest.mark.parametrize("n_envs", [1, 2])
def test_episodes_joined_across_batches(n_envs: int) -> None:
    batches = list(_collector(n_envs, frames=24 * n_envs, total=480 * n_envs))
    splitter = RolloutEpisodes()
    got: list[dict[str, np.ndarray]] = []
    for batch in batches:
        got.extend(splitter.add(batch))
    for ep in got:
        _check_episode(ep)
    envs = [None] if n_envs == 1 else list(range(n_envs))
    want = [ep for env in envs for ep in _reference(batches, env)]
    assert len(got) == len(want) > 5
    # several episodes span two or more batches of 24 steps
    assert sum(len(ep["next/reward"]) > 24 for ep in got) >= 2

    def signature(ep: dict[str, np.ndarray]) -> bytes:
        return ep["observation"].tobytes() + ep["action"].tobytes()

    assert sorted(map(signature, got)) == sorted(map(signature, want))
    by_sig = {signature(ep): ep for ep in want}
    for ep in got:
        ref = by_sig[signature(ep)]
        for key, value in ref.items():
            assert np.array_equal(ep[key], value), key
    # what is left is the tail of each env's stream: flushed, truncated
    tails = splitter.flush()
    assert 0 < len(tails) <= n_envs and splitter.pending == 0
    for tail in tails:
        assert bool(tail["next/truncated"][-1, 0]) and bool(tail["next/done"][-1, 0])


def test_from_rollout_one_call() -> None:
    batch = next(iter(_collector(1, frames=200, total=200, seed=3)))
    kept = from_rollout(batch)
    dropped = from_rollout(batch, unfinished="drop")
    cut = not bool(batch["next", "done"][-1])  # whether the rollout's last episode is cut
    assert len(kept) == len(dropped) + cut
    assert sum(len(ep["next/reward"]) for ep in kept) == 200
    for ep in dropped:
        _check_episode(ep)


def test_bad_rollouts() -> None:
    from tensordict import TensorDict

    flat = TensorDict({"observation": torch.zeros(4, 3)}, batch_size=[4])
    with pytest.raises(RecordingError, match="no \\('next', 'reward'\\)"):
        from_rollout(flat)
    deep = TensorDict({"observation": torch.zeros(2, 2, 2, 3)}, batch_size=[2, 2, 2])
    with pytest.raises(RecordingError, match="batch size \\(2, 2, 2\\)"):
        from_rollout(deep)
    with pytest.raises(RecordingError, match="unfinished='keep'"):
        from_rollout(flat, unfinished="keep")


def test_env_rollout_without_trajectory_ids() -> None:
    """``env.rollout`` has no ``collector/traj_ids``: episodes are cut after every next/done."""
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1")
    env.set_seed(5)
    rollout = env.rollout(150, break_when_any_done=False)
    assert ("collector", "traj_ids") not in rollout.keys(include_nested=True)
    episodes = from_rollout(rollout, unfinished="drop")
    assert len(episodes) == int(rollout["next", "done"].sum()) >= 3
    for ep in episodes:
        _check_episode(ep)


@pytest.mark.parametrize("kept", ["done", "done+truncated", "done+terminated"])
def test_a_rollout_with_done_alone_gets_the_flags_done_leaves(kept: str) -> None:
    """An older env's rollout without ("next", "truncated") (or with done alone) failed at
    ``add_episode`` naming the missing flag, with no way to give it."""
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1")
    env.set_seed(5)
    rollout = env.rollout(150, break_when_any_done=False)
    for flag in ("terminated", "truncated"):
        if flag not in kept:
            del rollout["next", flag]
    for ep in from_rollout(rollout, unfinished="drop"):
        _check_episode(ep)
        done = ep["next/terminated"] | ep["next/truncated"]
        assert done[-1].all() and not done[:-1].any()
        assert not (ep["next/terminated"] & ep["next/truncated"]).any()


def test_extend_from_rollout_one_call_per_batch() -> None:
    """``extend_from_rollout(writer, rollout, episodes)``: one call per ``[n_envs, T]`` batch
    commits exactly the episodes :class:`RolloutEpisodes` completes; without ``episodes`` the
    batch's unfinished episodes are committed truncated."""
    from rlds_cli.recording.torchrl import extend_from_rollout
    from tests.recording_fixtures import MemorySink

    batches = list(_collector(2, frames=40, total=400, seed=4))
    joined, sink = RolloutEpisodes(), MemorySink()
    counts = [extend_from_rollout(sink, batch, joined) for batch in batches]
    reference = RolloutEpisodes()
    assert counts == [len(reference.add(batch)) for batch in batches]
    assert len(sink.episodes) == sum(counts) > 5
    alone = MemorySink()
    n = extend_from_rollout(alone, batches[0])
    assert n == len(alone.episodes) == len(from_rollout(batches[0]))
    assert sum(len(ep["next/reward"]) for ep in alone.episodes) == 40


def test_a_batch_of_split_trajectories_keeps_only_the_steps_its_mask_marks() -> None:
    """split_trajs=True pads each trajectory's row after its steps: the padding was recorded as a
    26-step episode of zeros (seed 1), or joined to trajectory 0 (seed 0: refused by add_episode)."""
    for seed in (0, 1):
        (batch,) = list(_collector(1, frames=40, total=40, seed=seed, split_trajs=True))
        mask = batch["collector", "mask"].numpy()
        assert not mask.all()  # padded
        splitter = RolloutEpisodes()
        got = splitter.add(batch) + splitter.flush()
        assert sum(len(ep["next/reward"]) for ep in got) == int(mask.sum()) == 40
        for ep, row in zip(got, range(len(mask)), strict=True):
            real = batch[row][batch[row]["collector", "mask"]]
            assert np.array_equal(ep["observation"], real["observation"].numpy())
            assert np.array_equal(ep["next/observation"], real["next", "observation"].numpy())


def test_an_episode_left_open_survives_a_collector_that_refills_its_batch() -> None:
    """return_same_td=True: the collector writes every batch into one TensorDict; the kept piece
    of an open episode was a view of it, overwritten by the next batch."""
    splitter, got, seen = RolloutEpisodes(), [], []
    for batch in _collector(1, frames=16, total=160, return_same_td=True):
        seen.append(batch.clone())
        got.extend(splitter.add(batch))
    want = _reference(seen, None)
    assert len(got) == len(want) >= 3 and sum(len(ep["next/reward"]) > 16 for ep in got) >= 1
    for ep, ref in zip(got, want, strict=True):
        for key, value in ref.items():
            assert np.array_equal(ep[key], value), key
