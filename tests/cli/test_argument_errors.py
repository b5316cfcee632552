"""Arguments a hostile-input hunt passed that reached numpy (its own message, or a silent
truncation) instead of one clear error: mixture weights that are no numbers, priorities of the
wrong length or float indices for ``update_priority``; and a growing dataset whose ``min_total``
is over its ``capacity`` (ready only with demonstrations: a warning, not a refusal; a ``min_size``
over it is refused: see ``tests/loader/test_readiness.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.loader import MixtureLoader
from tests.dataset_fixtures import uid_episode


def _dataset(name: str, episodes: int = 2) -> None:
    with rlds_cli.DatasetWriter(name) as w:
        for uid in range(episodes):
            w.add_episode(uid_episode(uid, 5))


@pytest.mark.parametrize(
    "weights",
    [
        {"a": "x", "b": 1.0},
        {"a": None, "b": 1.0},
        ["ab", 1.0],
        ["1", "2"],
        {"a": "1", "b": 2.0},
        np.array(["1", "2"], dtype=object),
    ],
)
def test_mixture_weights_that_are_no_numbers_are_one_error(isolated_cache: Path, weights: object) -> None:
    _dataset("a")
    _dataset("b")
    with pytest.raises(ValueError, match="weights must be 2 finite non-negative numbers"):
        MixtureLoader({"a": "a", "b": "b"}, weights, batch_size=4, seed=0)  # type: ignore[arg-type]
    schedule = MixtureLoader({"a": "a", "b": "b"}, lambda step: "ab", batch_size=4, seed=0)
    with pytest.raises(ValueError, match="weights must be 2 finite non-negative numbers"):
        schedule.sample()


def test_update_priority_refuses_a_wrong_length_and_float_indices(isolated_cache: Path) -> None:
    _dataset("p")
    loader = rlds_cli.Loader("p", batch_size=4, seed=0, sampler="prioritized")
    index = loader.sample()["index"]
    with pytest.raises(ValueError, match="one priority per index"):
        loader.update_priority(index, np.ones(3))
    with pytest.raises(ValueError, match="indices must be integers"):
        loader.update_priority(np.array([0.5, 2.7]), np.ones(2))
    loader.update_priority(index, np.ones(len(index)))  # the right shape still goes
    loader.update_priority(index, 2.0)  # one for all


def test_min_total_over_capacity_warns(isolated_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        rlds_cli.DatasetWriter("w", capacity=10, min_total=20).close()
    assert "min_total=20 is over capacity=10" in caplog.text


def test_a_storage_asked_for_is_never_ignored(isolated_cache: Path) -> None:
    """Converting the same source again with another --storage was 'already in the cache' with
    the old storage; without --storage the dataset is reused (or rebuilt by --force) as stored."""
    from typer.testing import CliRunner

    from rlds_cli.cli.app import app
    from rlds_cli.errors import DatasetExistsError
    from rlds_cli.sources.download import download

    first = download("demo", backend="zarr")
    name = first.manifest.name
    assert download("demo").reused and download("demo", backend="zarr").reused
    with pytest.raises(DatasetExistsError, match="stored as zarr; storage memmap was asked for"):
        download("demo", backend="memmap")
    result = CliRunner().invoke(app, ["download", "demo", "--storage", "memmap"])
    assert result.exit_code == 1 and "--force" in result.output, result.output
    assert download("demo", force=True).manifest.backend == "zarr"  # --force keeps the storage
    assert download("demo", backend="memmap", force=True).manifest.backend == "memmap"
    assert rlds_cli.open_dataset(name).manifest.backend == "memmap"
