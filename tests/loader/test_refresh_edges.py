"""Refresh edges a hostile-input hunt found (issue 25): a mixture's windows follow a refreshed
member (they read the old view's episodes: rows got another episode's window, or an
IndexError); a loader follows a view its dataset object was refreshed to by someone else (the
user reading ``ds.ready``: it served evicted episodes for good); a view a sampler cannot follow
keeps raising the same error (it left the loader half updated: numpy errors, or slices across
episodes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader import MixtureLoader
from tests.dataset_fixtures import uid_episode


def _add(name: str, uids: list[int], lengths: list[int], **options: object) -> None:
    with rlds_cli.DatasetWriter(name, mode="append", commit_interval=0, **options) as w:  # type: ignore[arg-type]
        for uid, length in zip(uids, lengths, strict=True):
            w.add_episode(uid_episode(uid, length))


@pytest.mark.parametrize("grows", ["off", "on"])
def test_mixture_windows_follow_a_refreshed_member(isolated_cache: Path, grows: str) -> None:
    _add("off", [1, 2], [10, 10])
    _add("on", [3, 4], [6, 6])
    mix = MixtureLoader(
        {"off": "off", "on": "on"},
        {"off": 0.5, "on": 0.5},
        batch_size=64,
        seed=0,
        refresh=1,
        split="fixed",
        keys=["observation", "info/episode_uid"],
        windows={"observation": [0, 1]},
    )
    mix.sample()
    _add(grows, [10 if grows == "off" else 11], [4])  # a short episode, then the others move
    for _ in range(3):
        batch = mix.sample()
        window = batch["observation"].numpy()  # (rows, 2 steps, 2): [uid, step]
        uid = batch["info/episode_uid"].numpy().reshape(-1)
        assert (window[:, 0, 0] == uid).all()  # the row's own episode
        pad = batch["observation_is_pad"].numpy()[:, 1]
        assert (window[~pad, 1, 0] == uid[~pad]).all() and (
            window[~pad, 1, 1] == window[~pad, 0, 1] + 1
        ).all()


@pytest.mark.parametrize("sampler", ["uniform", "slice", "prioritized", "epoch"])
def test_a_loader_follows_a_view_its_dataset_was_refreshed_to(isolated_cache: Path, sampler: str) -> None:
    _add("g", [1, 2], [4, 4], capacity_episodes=3)
    ds = rlds_cli.open_dataset("g")
    options = {"slice_len": 2} if sampler == "slice" else {}
    loader = rlds_cli.Loader(
        ds, batch_size=16, seed=0, refresh=1, sampler=sampler, keys=["info/episode_uid"], **options
    )
    loader.sample()
    _add("g", [3, 4, 5], [4, 4, 4])  # 1 and 2 evicted
    assert ds.refresh() and ds.ready  # the user reads the dataset object: its view moves
    served = {int(u) for _ in range(4) for u in loader.sample()["info/episode_uid"].numpy().reshape(-1)}
    assert served <= {3, 4, 5} and served


def test_a_mixture_member_refreshed_by_the_user_becomes_ready(isolated_cache: Path) -> None:
    _add("off", [1], [8])
    with rlds_cli.DatasetWriter("on", min_size=8) as w:
        w.add_episode(uid_episode(2, 4))
    on = rlds_cli.open_dataset("on")
    mix = MixtureLoader(
        {"off": "off", "on": on}, {"off": 0.5, "on": 0.5}, batch_size=8, seed=0, refresh=1, split="fixed"
    )
    mix.sample()
    _add("on", [3], [6])
    assert on.refresh() and on.ready
    uids = mix.sample()["source"].numpy()
    assert np.bincount(uids, minlength=2).tolist() == [4, 4]


def test_a_view_the_sampler_cannot_follow_keeps_raising_its_error(isolated_cache: Path) -> None:
    _add("g", [1], [9])
    loader = rlds_cli.Loader(
        "g", batch_size=8, seed=0, refresh=1, sampler="slice", slice_len=8, short="error"
    )
    loader.sample()
    _add("g", [2], [3])  # shorter than a slice
    for _ in range(3):  # the same clear error each time, never numpy's from a half-made view
        with pytest.raises(ValueError, match="slice_len=8 is longer than 1 episode"):
            loader.sample()


@pytest.mark.parametrize("sampler", ["prioritized", "epoch", "uniform"])
def test_a_checkpoint_of_another_view_is_refused_even_of_the_same_size(
    isolated_cache: Path, sampler: str
) -> None:
    """With equal episodes and a capacity, the step count stays the same while evictions move
    every row: the old priorities (or epoch order) loaded by position drew other episodes."""
    _add("g", [1, 2, 3], [4, 4, 4], capacity_episodes=3)
    loader = rlds_cli.Loader("g", batch_size=8, seed=0, sampler=sampler, keys=["info/episode_uid"])
    loader.sample()
    state = loader.state_dict()
    _add("g", [4], [4])  # 1 evicted: the same 12 steps, other rows
    again = rlds_cli.Loader("g", batch_size=8, seed=0, sampler=sampler, keys=["info/episode_uid"])
    assert again.num_steps == loader.num_steps
    with pytest.raises(LoaderStateError, match="commit-log byte"):
        again.load_state_dict(state)
    same_view = rlds_cli.Loader(
        loader.dataset, batch_size=8, seed=0, sampler=sampler, keys=["info/episode_uid"]
    )
    same_view.load_state_dict(state)  # the view it was saved on: resumed
    assert same_view.sample()["index"].tolist() == loader.sample()["index"].tolist()
