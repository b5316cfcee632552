"""``resident_window=`` (issue 42 item 3): uniform and slice sampling restricted to a window of
blocks of whole episodes that advances as it draws; about uniform over a cycle; resumable."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader import Loader, SliceSampler, UniformSampler
from rlds_cli.loader.samplers import ResidentWindow

LENGTHS = np.random.default_rng(0).integers(20, 80, 300)
N = int(LENGTHS.sum())


def _uniform(seed: int = 1, **kw: Any) -> UniformSampler:
    return UniformSampler(N, 64, seed, resident_window=4, block_rows=256, episode_lengths=LENGTHS, **kw)


def _block_of(window: ResidentWindow, steps: np.ndarray) -> np.ndarray:
    return np.searchsorted(window.starts, steps, side="right") - 1


def test_uniform_draws_from_the_window_only_and_about_uniformly_over_cycles() -> None:
    s = _uniform()
    window = s.resident
    assert window is not None and window.window == 4 and window.num_blocks > 40
    counts = np.zeros(N)
    for _ in range(3000):
        resident = set(window.blocks().tolist())
        idx = s.sample()
        assert set(_block_of(window, idx).tolist()) <= resident  # only the resident blocks
        counts[idx] += 1
    assert window.position > 2 * window.num_blocks  # the window went round more than twice
    assert counts.min() > 0  # every step drawn
    # about as spread as independent uniform draws (Poisson: std = sqrt(mean))
    assert counts.std() < 1.3 * np.sqrt(counts.mean())


def test_slices_stay_inside_resident_episodes() -> None:
    for weight in ("steps", "episodes"):
        s = SliceSampler(LENGTHS, 8, 10, resident_window=3, block_rows=256, seed=0, weight=weight)
        window = s.resident
        assert window is not None
        for _ in range(200):
            resident = set(window.blocks().tolist())
            draw = s.sample()
            assert draw.extras["mask"].all()
            first, last = draw.indices[:, 0], draw.indices[:, -1]
            assert (s.episodes.episode_of(first) == s.episodes.episode_of(last)).all()  # one episode
            assert set(_block_of(window, first).tolist()) <= resident


@pytest.mark.parametrize("weight", ["steps", "episodes"])
def test_slices_of_short_and_long_episodes_are_drawn_as_without_the_window(weight: str) -> None:
    """A block stayed resident for its rows' worth of drawn steps, though a draw picks a window
    (an episode): 8-step episodes' windows were drawn 7x as often as long episodes' (weight
    'episodes': long episodes 26x as often as short ones)."""
    lengths = np.r_[np.full(5, 200), np.full(50, 8)]
    np.random.default_rng(0).shuffle(lengths)
    short = lengths == 8

    def rates(**window: Any) -> tuple[float, float]:
        s = SliceSampler(lengths, 64, 8, seed=0, weight=weight, **window)
        counts = np.zeros(len(lengths))
        for _ in range(400):
            np.add.at(counts, s.episodes.episode_of(s.sample().indices[:, 0]), 1)
        per = counts / (s._windows if weight == "steps" else 1)
        return per[~short].mean(), per[short].mean()

    plain_long, plain_short = rates()
    for window in ({"resident_window": 1, "block_rows": 8}, {"resident_window": 4, "block_rows": 64}):
        long_rate, short_rate = rates(**window)
        assert 0.7 < (short_rate / long_rate) / (plain_short / plain_long) < 1.4, window


def test_states_resume_exactly_with_the_states_seed() -> None:
    a = _uniform(seed=1)
    for _ in range(50):
        a.sample()
    b = _uniform(seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(100):
        assert (a.sample() == b.sample()).all()
    sa = SliceSampler(LENGTHS, 4, 6, resident_window=2, block_rows=300, seed=3)
    for _ in range(30):
        sa.sample()
    sb = SliceSampler(LENGTHS, 4, 6, resident_window=2, block_rows=300, seed=4)
    sb.load_state_dict(sa.state_dict())
    assert all((sa.sample().indices == sb.sample().indices).all() for _ in range(50))


def test_bad_arguments_and_states() -> None:
    with pytest.raises(ValueError, match="resident_window must be a positive integer"):
        _uniform().__class__(N, 8, 0, resident_window=0, episode_lengths=LENGTHS)
    with pytest.raises(ValueError, match="pass resident_window too"):
        UniformSampler(N, 8, 0, block_rows=10)
    with pytest.raises(ValueError, match="sum to"):
        UniformSampler(N + 1, 8, 0, resident_window=2, episode_lengths=LENGTHS)
    s = _uniform()
    with pytest.raises(ValueError, match="drop refresh="):
        s.follow(None)  # type: ignore[arg-type]
    good = s.state_dict()
    # drawn past its block's rows: the next draw walked 2**62 blocks one by one (a hang)
    huge = {**good, "resident": {"position": 0, "drawn": 2**62}}
    for bad in ({**good, "resident": {"position": -1, "drawn": 0}}, {**good, "resident": None}, huge):
        with pytest.raises(LoaderStateError, match="resident window"):
            s.load_state_dict(bad)
    assert s.state_dict() == good


def test_loader_resident_window_end_to_end_with_prefetch(ted_dataset: Any) -> None:
    ds = ted_dataset([120, 80, 200, 150, 90, 160, 100, 100])
    loader = Loader(ds, 32, sampler="uniform", seed=2, resident_window=2, block_rows=128, prefetch=2, keys=[])
    for _ in range(5):
        loader.sample()
    state = loader.state_dict()  # the prefetched batches are put back
    again = Loader(ds, 32, sampler="uniform", seed=9, resident_window=2, block_rows=128, keys=[])
    again.load_state_dict(state)
    expected = [loader.sample()["index"].tolist() for _ in range(10)]
    assert [again.sample()["index"].tolist() for _ in range(10)] == expected
    window = again.sampler.resident  # type: ignore[attr-defined]
    assert window.num_blocks == 7 and window.block_rows == 128  # episodes 0-1 start in one chunk
    sliced = Loader(ds, 40, sampler="slice", slice_len=8, seed=0, resident_window=3, keys=[])
    assert sliced.sample()["index"].shape == (5, 8)
    with pytest.raises(ValueError, match="sampler 'epoch' has no option"):
        Loader(ds, 32, sampler="epoch", resident_window=2)


@pytest.mark.parametrize("options", [{"sampler": "blocks"}, {"sampler": "uniform", "resident_window": 2}])
def test_refresh_is_refused_at_construction(isolated_cache: Any, options: dict[str, Any]) -> None:
    from tests.dataset_fixtures import uid_episode

    with rlds_cli.DatasetWriter("grow") as writer:
        writer.add_episode(uid_episode(1, 5))
    with pytest.raises(ValueError, match="refresh= cannot follow a growing dataset"):
        Loader("grow", batch_size=4, seed=0, refresh=1, **options)
