"""A dataset rebuilt (``--force``) under a reader: one behaviour for memmap and zarr (issue 25).

Reading from disk, the next batch raises DatasetReplacedError for both backends (memory maps
would read the old version on silently; a loader on them checks at most every 2 ms, and the
batches in between come whole from the mapped version); a loader that copied the dataset into RAM serves its
snapshot of one version."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.errors import DatasetReplacedError
from tests.dataset_fixtures import make_dataset


def _every_read_says_replaced(*reads: Callable[[], object]) -> None:
    for read in reads:
        with pytest.raises(DatasetReplacedError, match="replaced"):
            read()


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_replaced_under_a_loader_and_a_dataset(
    isolated_cache: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.loader import sources

    # every batch checks here: with the 2 ms interval a replacement quicker than that (a small
    # dataset, fsync off) left the next batch inside it, and this test failed now and then; the
    # interval has its own test below, on a driven clock
    monkeypatch.setattr(sources, "REPLACED_CHECK_NS", 0)
    make_dataset("r", [40, 30, 50, 20], backend=backend)
    on_disk = rlds_cli.Loader("r", batch_size=32, seed=0, in_memory=False)
    in_ram = rlds_cli.Loader("r", batch_size=32, seed=0, in_memory=True, pack=False)
    ds = rlds_cli.open_dataset("r")
    old = ds[:]
    on_disk.sample()
    make_dataset("r", [3, 4], backend=backend, replace=True)  # what 'rlds download --force' does
    _every_read_says_replaced(on_disk.sample, lambda: ds.gather(np.arange(10)), lambda: ds.episode(0))
    batch = in_ram.sample()  # a copy in RAM: a snapshot of the old version, read on
    idx = batch["index"].numpy()
    assert np.array_equal(batch["observation"].numpy(), old["observation"][idx])
    assert rlds_cli.open_dataset("r").num_steps == 7


def test_memory_maps_check_for_a_replacement_at_most_every_interval(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On memory maps the check is one stat at most every ``REPLACED_CHECK_NS`` (driven here by a
    fake clock): batches in between come whole from the mapped version, and the first batch once
    the interval has passed raises."""
    from rlds_cli.loader import sources

    now = [10**12]
    monkeypatch.setattr(sources, "_clock_ns", lambda: now[0])
    make_dataset("m", [40, 30, 50, 20])
    loader = rlds_cli.Loader("m", batch_size=32, seed=0, in_memory=False)
    old = rlds_cli.open_dataset("m")[:]
    loader.sample()  # checks, and the next check is due one interval later
    make_dataset("m", [3, 4], replace=True)
    for _ in range(3):  # within the interval: the old version, whole
        batch = loader.sample()
        idx = batch["index"].numpy()
        assert np.array_equal(batch["observation"].numpy(), old["observation"][idx])
    now[0] += sources.REPLACED_CHECK_NS
    with pytest.raises(DatasetReplacedError, match="replaced"):
        loader.sample()


@pytest.mark.parametrize("by", ["converted", "growing"])
@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_growing_dataset_replaced_under_a_loader_and_a_dataset(
    isolated_cache: Path, backend: str, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a growing dataset (its newest segments read into RAM, its columns over
    several segments), replaced by a converted one (``--force``) or removed and written anew:
    a reader from disk, refreshing or not, and a view raise; a fresh open reads the new one."""
    import shutil

    from rlds_cli.loader import sources
    from tests.dataset_fixtures import uid_episode

    monkeypatch.setattr(sources, "REPLACED_CHECK_NS", 0)  # see the test above
    with rlds_cli.DatasetWriter("r", storage=backend) as w:
        for uid in range(1, 6):
            w.add_episode(uid_episode(uid, 20 + uid))
            w.flush()  # a segment each
    keys = ["observation", "info/episode_uid"]
    on_disk = rlds_cli.Loader("r", batch_size=32, seed=0, in_memory=False, keys=keys)
    refreshing = rlds_cli.Loader("r", batch_size=32, seed=0, refresh=1, keys=keys)
    ds = rlds_cli.open_dataset("r")
    for loader in (on_disk, refreshing):
        assert set(loader.sample()["info/episode_uid"].tolist()) <= {1, 2, 3, 4, 5}
    ds.gather(np.arange(10))  # its columns opened (the small segments read into RAM)
    if by == "converted":
        make_dataset("r", [3, 4], backend=backend, replace=True)  # what 'rlds download --force' does
    else:
        shutil.rmtree(ds.directory)
        with rlds_cli.DatasetWriter("r", storage=backend) as w:
            for uid in (7, 8):
                w.add_episode(uid_episode(uid, 3 + uid - 7))
    _every_read_says_replaced(
        on_disk.sample, refreshing.sample, lambda: ds.gather(np.arange(10)), lambda: ds.episode(0), ds.refresh
    )
    assert rlds_cli.open_dataset("r").num_steps == 7
