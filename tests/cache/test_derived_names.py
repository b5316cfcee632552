"""A derived dataset never replaces what it is made of, and never takes a stale view's positions
for episodes of a replaced parent (hostile-input hunt, 2026-11-28)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlds_cli.cache.compose import downsample_dataset, merge_datasets, trim_dataset
from rlds_cli.cache.derive import create_selection, create_view, drop_episodes, split_dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import CorruptDatasetError, DatasetExistsError, InvalidSelectionError
from rlds_cli.inspection.audit import audit
from rlds_cli.inspection.validate import check_dataset
from tests.dataset_fixtures import assert_same, everything, make_dataset

pytestmark = pytest.mark.usefixtures("isolated_cache")

MADE_FROM = "cannot be replaced by a dataset made from it"


@pytest.fixture
def parent() -> str:
    make_dataset("p", [3, 4, 2, 5, 3, 4])
    return "p"


REPLACING_ITS_OWN: dict[str, Callable[[str], Any]] = {
    "view": lambda n: create_view(n, n, (0, 2), replace=True),
    "selection": lambda n: create_selection(n, n, [1, 3], replace=True),
    "drop": lambda n: drop_episodes(n, [0], n, replace=True),
    "trim": lambda n: trim_dataset(n, n, start=1, replace=True),
    "downsample": lambda n: downsample_dataset(n, n, 2, replace=True),
    "audit keep": lambda n: audit(n).keep(n, replace=True),
}


@pytest.mark.parametrize("make", REPLACING_ITS_OWN.values(), ids=REPLACING_ITS_OWN.keys())
def test_a_dataset_is_never_replaced_by_one_made_from_it(parent: str, make: Callable[[str], Any]) -> None:
    """With --force, each of these left a dataset pinning itself as its parent: a view, selection,
    drop, trim or kept audit also deleted the arrays it reads (its reads: RecursionError)."""
    before = everything(parent)
    with pytest.raises(DatasetExistsError, match=MADE_FROM):
        make(parent)
    assert_same(everything(parent), before)
    assert check_dataset(open_dataset(parent)).ok


def test_nor_by_one_made_from_it_through_others(parent: str) -> None:
    downsample_dataset(parent, "x", 2)
    trim_dataset("x", "y", start=1)
    merge_datasets(["y", parent], "m")
    before = everything("x")
    for make in (
        lambda: merge_datasets(["m", "y"], "x", replace=True),
        lambda: create_view("y", "x", (0, 1), replace=True),
    ):
        with pytest.raises(DatasetExistsError, match=f"dataset 'x' {MADE_FROM}"):
            make()
    assert_same(everything("x"), before)
    create_view(parent, "x", (0, 1), replace=True)  # not made from x: replacing it is allowed
    # a copy is refused only in place of its own parent: it reads nothing through others
    downsample_dataset(parent, "c", 2)
    downsample_dataset("c", "c2", 2)
    downsample_dataset("c2", "c", 2, replace=True)


def test_a_split_that_fails_before_publishing_keeps_the_old_pair(
    parent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old views were removed before the new ones were sealed: a full disk lost both."""
    import errno

    from rlds_cli.cache import transaction

    split_dataset(parent, 0.5)
    before = {n: everything(n) for n in ("p-train", "p-val")}
    calls = []

    def seal(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_seal(*args, **kwargs)

    real_seal = transaction.seal
    monkeypatch.setattr(transaction, "seal", seal)
    with pytest.raises(OSError, match="No space"):
        split_dataset(parent, 0.5, seed=1, replace=True)
    for name, data in before.items():
        assert_same(everything(name), data)
    with pytest.raises(InvalidSelectionError, match="a split needs two names, got 'x' for both views"):
        split_dataset(parent, 0.5, train_name="x", val_name="x")


def test_a_view_of_a_view_whose_parent_was_replaced_is_refused(parent: str) -> None:
    """The positions a stale view keeps named other episodes of the new parent: views, splits and
    drops of it verified clean, of other data."""
    downsample_dataset(parent, "x", 2)
    create_view("x", "v", (2, 5))
    downsample_dataset(parent, "x", 3, replace=True)
    stale = "view 'v': its parent 'x' was replaced since it was made"
    for make in (
        lambda: create_view("v", "w", (0, 2)),
        lambda: split_dataset("v", 0.5),
        lambda: drop_episodes("v", [0], "d"),
        lambda: trim_dataset("v", "t", start=1),
    ):
        with pytest.raises(CorruptDatasetError, match=stale):
            make()


def test_a_split_whose_train_view_replaces_its_input(parent: str) -> None:
    """split a-train -n a --force: the train view was published over its input before the
    validation view was chosen from it (positions of the old view in the new one: refused)."""
    create_view(parent, "a-train", (0, 5))
    train, val = split_dataset("a-train", 0.4, train_name="a-train", val_name="a-val", replace=True)
    parts = [set(open_dataset(n).view_parent()[1].tolist()) for n in ("a-train", "a-val")]  # type: ignore[index]
    assert not parts[0] & parts[1] and parts[0] | parts[1] == {0, 1, 2, 3, 4}
    assert (train.num_episodes, val.num_episodes) == (3, 2)
    for name in ("a-train", "a-val"):
        assert check_dataset(open_dataset(name)).ok


def test_a_trim_of_a_dataset_missing_a_file_is_refused(parent: str, isolated_cache: Path) -> None:
    (isolated_cache / "datasets" / parent / "arrays" / "action.npy").unlink()
    with pytest.raises(CorruptDatasetError, match=r"dataset 'p' cannot be trimmed: .*action\.npy"):
        trim_dataset(parent, "t", start=1)
    assert not (isolated_cache / "datasets" / "t").exists()


def test_a_split_fraction_that_rounds_to_every_episode_says_so(parent: str) -> None:
    with pytest.raises(
        InvalidSelectionError, match=r"--val 0\.99 of the 6 episodes of 'p' rounds to all of them"
    ):
        split_dataset(parent, 0.99)
    make_dataset("one", [3])
    with pytest.raises(InvalidSelectionError, match="dataset 'one' has 1 episode: too few to split"):
        split_dataset("one", 0.5)
