"""``in_memory="auto"`` (the Loader's default): zarr datasets that fit the budget are loaded into
RAM, memory maps stay on disk, ``$RLDS_MEMORY_BUDGET`` sets the budget, explicit choices win."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.sizes import BUDGET_ENV, memory_budget, stored_bytes
from tests.loader_fixtures import TedFactory, make_ted

LENGTHS = [7, 3, 12, 5]


@pytest.fixture
def zarr_ds(ted_dataset: TedFactory, tmp_path: Path) -> Dataset:
    return ted_dataset(LENGTHS, "z", backend="zarr", root=tmp_path)


def _batches(loader: Loader, n: int = 3) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy().copy() for k, v in loader.sample().items()} for _ in range(n)]


def test_a_small_zarr_dataset_is_loaded_and_samples_the_same_batches(
    zarr_ds: Dataset, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="rlds_cli.loader"):
        auto = Loader(zarr_ds, 4, seed=3)
    assert auto.in_memory is True
    said = [r.getMessage() for r in caplog.records]
    assert any("in_memory='auto'" in m and "loaded into RAM" in m for m in said)
    disk = Loader(zarr_ds, 4, seed=3, in_memory=False)
    assert disk.in_memory is False
    for a, b in zip(_batches(auto), _batches(disk), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_memmap_dataset_stays_on_disk(tmp_path: Path) -> None:
    ds = make_ted(tmp_path, "m", LENGTHS)
    assert Loader(ds, 4, seed=0).in_memory is False


@pytest.mark.parametrize(("budget", "loaded"), [("0", False), ("100", False), ("1G", True), ("2gib", True)])
def test_the_budget_variable_decides(
    zarr_ds: Dataset, monkeypatch: pytest.MonkeyPatch, budget: str, loaded: bool
) -> None:
    monkeypatch.setenv(BUDGET_ENV, budget)
    assert Loader(zarr_ds, 4, seed=0).in_memory is loaded


def test_only_the_columns_read_count(zarr_ds: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    everything = stored_bytes(zarr_ds, None)
    action_only = stored_bytes(zarr_ds, ["action"])
    n = sum(LENGTHS)
    assert action_only == n * 2 * 4  # float32 [2] per step
    # observation and next/observation are one stored column (N + E rows of 3 float32)
    assert stored_bytes(zarr_ds, ["observation", "next/observation"]) == (n + len(LENGTHS)) * 3 * 4
    assert action_only < everything
    monkeypatch.setenv(BUDGET_ENV, str(action_only))
    assert Loader(zarr_ds, 4, seed=0, keys=["action"]).in_memory is True
    assert Loader(zarr_ds, 4, seed=0).in_memory is False


def test_explicit_choices_win(zarr_ds: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUDGET_ENV, "0")
    assert Loader(zarr_ds, 4, seed=0, in_memory=True).in_memory is True
    monkeypatch.setenv(BUDGET_ENV, "1T")
    assert Loader(zarr_ds, 4, seed=0, in_memory=False).in_memory is False


@pytest.mark.parametrize("bad", ["lots", "-1", "1X", "G"])
def test_a_bad_budget_names_the_variable(zarr_ds: Dataset, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(BUDGET_ENV, bad)
    with pytest.raises(ValueError, match=BUDGET_ENV):
        Loader(zarr_ds, 4, seed=0)


def test_the_default_budget_is_a_share_of_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    budget = memory_budget()
    assert 0 < budget <= 8 << 30
