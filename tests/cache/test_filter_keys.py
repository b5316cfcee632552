"""Filter keys kept from a robomimic file: the episodes each names, the in-memory view of one,
views of views, pickling, and the refusals (an unknown key names the known ones)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.cache.derive import (
    create_selection,
    create_view,
    filter_key_episodes,
    filter_key_names,
    filtered_dataset,
)
from rlds_cli.errors import CorruptDatasetError, InvalidSelectionError
from rlds_cli.sources.convert import convert
from tests.robomimic_fixtures import IMAGE, LIBERO, differences


def test_each_key_names_its_demos_by_position() -> None:
    convert(IMAGE, "img")
    ds = open_dataset("img")  # demos 0, 1, 2, 10; train = 0, 2, 10; valid = 1
    assert filter_key_names(ds) == ["train", "valid"]
    assert filter_key_episodes(ds, "train").tolist() == [0, 2, 3]
    assert filter_key_episodes(ds, "valid").tolist() == [1]


def test_the_in_memory_view_reads_the_keys_demos_and_pickles() -> None:
    convert(IMAGE, "img")
    train = filtered_dataset(open_dataset("img"), "train")
    assert (train.num_episodes, train.num_steps) == (3, 11)
    assert differences(train, IMAGE, "train") == []
    again = pickle.loads(pickle.dumps(train))
    np.testing.assert_array_equal(again[:]["action"], train[:]["action"])


def test_views_read_their_parents_keys_row_for_row() -> None:
    convert(IMAGE, "img")
    create_view("img", "tail", (1, 4))  # demos 1, 2, 10
    tail = open_dataset("tail")
    assert filter_key_episodes(tail, "train").tolist() == [1, 2]
    assert tail.source_metadata["robomimic"]["attrs"]["total"] == 14
    assert tail.episode_metadata(0)["robomimic/model_file"].endswith('pos="0 0 1"/></worldbody></mujoco>')
    create_selection("img", "picked", [0, 3])
    picked = filtered_dataset(open_dataset("picked"), "train")  # a key of a selection view
    assert picked.episodes["source_id"].tolist() == [0, 10]


def test_unknown_and_empty_keys_are_refused_in_one_line() -> None:
    convert(IMAGE, "img")
    convert(LIBERO, "lib")
    with pytest.raises(
        InvalidSelectionError, match="has no filter key 'test'; its filter keys: train, valid"
    ):
        filter_key_episodes(open_dataset("img"), "test")
    with pytest.raises(InvalidSelectionError, match="its filter keys: none"):
        filtered_dataset(open_dataset("lib"), "train")
    create_view("img", "first", (0, 1))
    with pytest.raises(InvalidSelectionError, match="holds none of the episodes"):
        filter_key_episodes(open_dataset("first"), "valid")


def test_a_lost_membership_array_is_reported_not_guessed() -> None:
    convert(IMAGE, "img")
    ds = open_dataset("img")
    (ds.directory / "source_metadata.npz").unlink()  # damage: the array the names index
    with pytest.raises(CorruptDatasetError, match=r"source_metadata\.npz is missing"):
        filter_key_episodes(open_dataset("img"), "train")
