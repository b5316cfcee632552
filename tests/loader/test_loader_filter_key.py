"""``Loader(NAME, filter_key=...)`` samples only the episodes of that robomimic filter key."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli import Loader
from rlds_cli.cache import open_dataset
from rlds_cli.errors import InvalidSelectionError
from rlds_cli.sources.convert import convert
from tests.robomimic_fixtures import IMAGE


def test_batches_come_from_the_keys_episodes_only() -> None:
    convert(IMAGE, "img")
    whole = open_dataset("img")[:]
    valid_rows = whole["action"][5:8]  # demo_1, the only valid demo (3 steps)
    loader = Loader("img", batch_size=16, filter_key="valid", seed=0, num_batches=4, epochs=None)
    assert loader.num_steps == 3
    for batch in loader:
        actions = batch["action"].numpy()
        assert all(any(np.array_equal(a, r) for r in valid_rows) for a in actions)


def test_an_unknown_key_is_refused_naming_the_known_ones() -> None:
    convert(IMAGE, "img")
    with pytest.raises(InvalidSelectionError, match="its filter keys: train, valid"):
        Loader("img", filter_key="test")


def test_a_filter_key_and_an_episode_list_are_not_both_taken() -> None:
    convert(IMAGE, "img")
    with pytest.raises(ValueError, match="give episodes= or filter_key=, not both"):
        Loader("img", filter_key="train", episodes=[0])
