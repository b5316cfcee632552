"""Goal relabeling at sample time: OGBench's ``GCDataset.sample_goals`` rules against a
row-at-a-time statement of them (given the same random numbers), HER "future", the reward and
mask rule, a user reward function, and exact resume with prefetch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import MixtureError, SeedError
from rlds_cli.loader import Loader
from rlds_cli.loader.relabel import GoalRelabel, GoalRule, her_future_indices, ogbench_goal_indices
from tests.loader_fixtures import TedFactory, make_ted, resumed_batches

LENGTHS = [5, 1, 9, 3, 14, 2]


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "gc")


def sample_goal_row(t: int, terminal_locs: list[int], rule: GoalRule, random_idx: int, offset: int,
                    distance: float, u_traj: float, u_cur: float) -> int:  # fmt: skip
    """OGBench's sample_goals for one row, written out: the episode end is the first terminal
    location at or after ``t``."""
    final = next(loc for loc in terminal_locs if loc >= t)
    if rule.geom_sample:
        traj = min(t + offset, final)
    else:
        traj = round(min(t + 1, final) * distance + final * (1 - distance))
    if rule.p_curgoal == 1.0:
        return t
    goal = traj if u_traj < rule.p_trajgoal / (1.0 - rule.p_curgoal) else random_idx
    return t if u_cur < rule.p_curgoal else goal


RULES = [
    GoalRule(0.2, 0.5, 0.3, True, 0.9),
    GoalRule(0.0, 1.0, 0.0, False),
    GoalRule(0.3, 0.0, 0.7, True),
    GoalRule(1.0, 0.0, 0.0, True),
    GoalRule(0.1, 0.6, 0.3, False),
]


@pytest.mark.parametrize("rule", RULES)
def test_ogbench_rule_against_row_statement(rule: GoalRule) -> None:
    rng = np.random.default_rng(1)
    ends = np.cumsum(LENGTHS)
    n = int(ends[-1])
    terminal_locs = (ends - 1).tolist()
    idx = np.tile(np.arange(n), 20)  # every step, many draws each
    last = (ends - 1)[np.searchsorted(ends - 1, idx)]
    random_idx = rng.integers(0, n, idx.shape)
    offsets = rng.geometric(1 - rule.discount, idx.shape)
    d, u1, u2 = rng.random((3, *idx.shape))
    got = ogbench_goal_indices(idx, last, rule, random_idx, offsets, d, u1, u2)
    want = [sample_goal_row(int(t), terminal_locs, rule, int(r), int(o), float(a), float(b), float(c))
            for t, r, o, a, b, c in zip(idx, random_idx, offsets, d, u1, u2, strict=True)]  # fmt: skip
    assert got.tolist() == want


def test_her_future_against_row_statement() -> None:
    rng = np.random.default_rng(2)
    ends = np.cumsum(LENGTHS)
    idx = np.tile(np.arange(int(ends[-1])), 10)
    last = (ends - 1)[np.searchsorted(ends - 1, idx)]
    u = rng.random(idx.shape)
    got = her_future_indices(idx, last, u)
    for t, end, x, g in zip(idx, last, u, got, strict=True):
        steps = list(range(int(t), int(end) + 1))  # the future of t, t itself included
        assert g == steps[int(x * len(steps))]
    # u = 0 is the step itself, u just below 1 the episode's last step
    assert her_future_indices(idx, last, np.zeros(idx.shape)).tolist() == idx.tolist()
    assert her_future_indices(idx, last, np.full(idx.shape, 1 - 1e-12)).tolist() == last.tolist()


def episode_of(i: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(LENGTHS), i, side="right")


@pytest.mark.parametrize("strategy", ["ogbench", "her_future"])
def test_loader_goals_rewards_masks(ds: Dataset, strategy: str) -> None:
    t = GoalRelabel(strategy, gc_negative=True, seed=3)
    loader = Loader(ds, 64, seed=0, transform=t)
    b = next(iter(loader))
    idx = b["index"].numpy()
    vi, ai = b["value_goal_index"].numpy(), b["actor_goal_index"].numpy()
    # goals are the goal steps' observations (observation[i] = [i, episode, i / 2])
    assert b["value_goal"].numpy()[:, 0].tolist() == vi.tolist()
    assert b["actor_goal"].numpy()[:, 0].tolist() == ai.tolist()
    success = (idx == vi).astype(np.float32)
    assert b["mask"].numpy().tolist() == (1 - success).tolist()
    assert b["next/reward"].numpy()[:, 0].tolist() == (success - 1).tolist()
    assert (vi >= 0).all() and (vi < ds.num_steps).all()
    if strategy == "her_future":
        assert (episode_of(vi) == episode_of(idx)).all() and (vi >= idx).all()
    else:  # the default actor rule: trajectory goals only
        assert (episode_of(ai) == episode_of(idx)).all() and (ai > idx).sum() > 0


def test_slices_keep_their_padding_mask_and_get_goal_mask(ds: Dataset) -> None:
    """Slices carry the sampler's padding mask (TorchRL's ("collector", "mask")): the relabeled
    mask replaced it, so padding counted as data."""
    plain = Loader(ds, 160, sampler="slice", slice_len=8, seed=0).sample()
    b = Loader(ds, 160, sampler="slice", slice_len=8, seed=0, transform=GoalRelabel(seed=0)).sample()
    assert b["mask"].dtype == plain["mask"].dtype and b["mask"].tolist() == plain["mask"].tolist()
    assert not plain["mask"].all()  # some padding
    success = (b["index"] == b["value_goal_index"]).float()
    assert b["goal_mask"].tolist() == (1 - success).tolist()


def test_reward_fn_and_positive_rewards(ds: Dataset) -> None:
    def near(batch: dict, goal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        close = np.abs(batch["observation"][:, 0] - goal[:, 0]) <= 1
        return close.astype(np.float32), (~close).astype(np.float32)

    b = next(iter(Loader(ds, 64, seed=0, transform=GoalRelabel(reward_fn=near, seed=1))))
    gap = (b["observation"][:, 0] - b["value_goal"][:, 0]).abs()
    assert b["next/reward"][:, 0].tolist() == (gap <= 1).float().tolist()
    b = next(iter(Loader(ds, 64, seed=0, transform=GoalRelabel(gc_negative=False, seed=1))))
    assert set(b["next/reward"][:, 0].tolist()) <= {0.0, 1.0}
    assert b["next/reward"][:, 0].tolist() == (b["index"] == b["value_goal_index"]).float().tolist()


@pytest.mark.parametrize("sampler", [{"sampler": "uniform"}, {"sampler": "slice", "slice_len": 4}])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_resume_exact(ds: Dataset, sampler: dict, prefetch: int) -> None:
    def make(seed: int) -> Loader:
        relabel = GoalRelabel(seed=5)
        return Loader(ds, 16, seed=seed, epochs=None, prefetch=prefetch, transform=relabel, **sampler)

    expected, resumed = resumed_batches(make, skip=3, take=4, seeds=(0, 1))
    for want, got in zip(expected, resumed, strict=True):
        for key in ("index", "value_goal", "actor_goal", "next/reward", "mask"):
            assert got[key].tolist() == want[key].tolist()


def test_seed_changes_goals(ds: Dataset) -> None:
    a = GoalRelabel(seed=0)
    b = GoalRelabel(seed=1)
    a.bind(ds)
    b.bind(ds)
    idx = np.arange(ds.num_steps)
    assert a.goal_indices(idx)[0].tolist() == a.goal_indices(idx)[0].tolist()
    assert a.goal_indices(idx)[0].tolist() != b.goal_indices(idx)[0].tolist()
    # seeds were cut to 32 bits: 1 and 2**32 + 1 drew the same goals
    c, d = GoalRelabel(seed=1), GoalRelabel(seed=2**32 + 1)
    c.bind(ds)
    d.bind(ds)
    assert c.goal_indices(idx)[0].tolist() == b.goal_indices(idx)[0].tolist()  # small seeds unchanged
    assert c.goal_indices(idx)[0].tolist() != d.goal_indices(idx)[0].tolist()


def test_bad_arguments(ds: Dataset, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        GoalRule(0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="discount"):
        GoalRule(discount=1.0)
    with pytest.raises(ValueError, match="strategy"):
        GoalRelabel("final")
    with pytest.raises(ValueError, match="goal_key 'info/goal'"):
        Loader(ds, 4, transform=GoalRelabel(goal_key="info/goal"))
    with pytest.raises(RuntimeError, match="bound"):
        GoalRelabel()({"index": np.arange(3)})
    with pytest.raises(SeedError, match=r"seed must be an integer from 0 to 2\*\*63 - 1"):
        GoalRelabel(seed=-1)  # it drew the goals of seed 2**32 - 1
    with pytest.raises(ValueError, match="value must be a GoalRule"):
        GoalRelabel(value={"p_curgoal": 1.0})  # type: ignore[arg-type]  # failed at the first batch


def test_mixture_with_prefetch_and_resume(ds: Dataset, tmp_path: Path) -> None:
    from rlds_cli.loader.mixture import MixtureSampler, MixtureSource

    other = make_ted(tmp_path, "gc2", [3, 8, 2])
    other_ends = np.cumsum([3, 8, 2])

    def make(seed: int) -> Loader:
        source = MixtureSource([ds, other])
        relabel = GoalRelabel("ogbench", seed=2).for_mixture(source)
        sampler = MixtureSampler(source.sizes, [0.5, 0.5], 32, seed)
        return Loader(source, 32, sampler=sampler, epochs=None, prefetch=2, transform=relabel)

    want, got = resumed_batches(make, skip=1, take=3, seeds=(0, 1))
    for w, g in zip(want, got, strict=True):
        for key in ("index", "source", "value_goal", "actor_goal", "next/reward", "mask"):
            assert g[key].tolist() == w[key].tolist()
        src, idx = w["source"].numpy(), w["index"].numpy()
        ai, vi = w["actor_goal_index"].numpy(), w["value_goal_index"].numpy()
        assert set(src.tolist()) == {0, 1}
        # actor goals (trajectory only) stay in the row's own episode of its own dataset
        for s, ends in ((0, np.cumsum(LENGTHS)), (1, other_ends)):
            rows = src == s
            ep = np.searchsorted(ends, idx[rows], side="right")
            assert (np.searchsorted(ends, ai[rows], side="right") == ep).all()
            assert (vi[rows] < ends[-1]).all()
        # goal observations are the goal steps' ([i, episode, i / 2] in both datasets)
        assert w["actor_goal"].numpy()[:, 0].tolist() == ai.tolist()


def _goal_dataset(root: Path, name: str, dtype: type, width: int, base: float) -> Dataset:
    from rlds_cli import DatasetWriter, open_dataset

    with DatasetWriter(name, mode="create", root=root) as writer:
        for e in range(2):
            obs = (base + e * 1000 + np.arange(4))[:, None] + np.arange(width) / 1000
            writer.add_episode({
                "observation": obs[:-1].astype(dtype), "next/observation": obs[1:].astype(dtype),
                "action": np.zeros((3, 1), np.float32), "next/reward": np.zeros(3, np.float32),
                "next/terminated": np.array([False, False, True]), "next/truncated": np.zeros(3, bool),
            })  # fmt: skip
    return open_dataset(name, root=root)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_mixture_goals_keep_each_sources_values_in_the_promoted_dtype_and_widest_shape(
    tmp_path: Path, order: tuple[int, int]
) -> None:
    """A float64 source's goals were cast to the dtype of the first source in the batch (float32:
    200002.001 read 200002.0), and a padded mixture of 2- and 3-wide goals failed in numpy."""
    import torch

    from rlds_cli.loader.mixture import MixtureSampler, MixtureSource

    made = [
        _goal_dataset(tmp_path, "g32", np.float32, 2, 0.0),
        _goal_dataset(tmp_path, "g64", np.float64, 3, 2e5),
    ]
    datasets = [made[i] for i in order]
    source = MixtureSource(datasets, keys=["observation"], pad=True, float_dtype=torch.float64)
    relabel = GoalRelabel("her_future", seed=0).for_mixture(source)
    sampler = MixtureSampler(source.sizes, [0.5, 0.5], 64, 0)
    loader = Loader(source, 64, sampler=sampler, float_dtype=torch.float64, transform=relabel)
    batch = loader.sample()
    src = batch["source"].numpy()
    assert set(src.tolist()) == {0, 1}
    for key in ("value_goal", "actor_goal"):
        goals = batch[key].numpy()
        assert goals.dtype == np.float64 and goals.shape == (64, 3)
        for s, ds in enumerate(datasets):
            rows = src == s
            want = ds.gather(batch[f"{key}_index"].numpy()[rows])["observation"]
            width = want.shape[1]
            assert np.array_equal(goals[rows, :width], want.astype(np.float64))
            assert not goals[rows, width:].any()


def test_mixture_goals_of_different_axes_are_refused(tmp_path: Path) -> None:
    from rlds_cli import DatasetWriter, open_dataset

    flat = _goal_dataset(tmp_path, "flat", np.float32, 2, 0.0)
    with DatasetWriter("deep", mode="create", root=tmp_path) as writer:
        obs = np.zeros((4, 2, 2), np.float32)
        writer.add_episode({
            "observation": obs[:-1], "next/observation": obs[1:], "action": np.zeros((3, 1), np.float32),
            "next/reward": np.zeros(3, np.float32), "next/terminated": np.array([False, False, True]),
            "next/truncated": np.zeros(3, bool),
        })  # fmt: skip
    with pytest.raises(
        MixtureError, match=r"'observation' is \(2,\) in source 'flat' but \(2, 2\) in source 'deep'"
    ):
        GoalRelabel().for_mixture([flat, open_dataset("deep", root=tmp_path)])
