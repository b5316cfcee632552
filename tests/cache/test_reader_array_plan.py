"""``TedReader``'s plan for numpy columns with no pooled output (rlds_cli/cache/reader.py
``_gather_arrays``, the low-dim memmap path) returns what its general loop returns, key for key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.reader import Episodes, TedReader, resolve_keys
from tests.loader_fixtures import TedFactory

LENGTHS = [5, 1, 9, 3, 12, 2, 7] * 4


@pytest.fixture(scope="module")
def dataset(ted_dataset: TedFactory) -> Any:
    return ted_dataset(LENGTHS, "plan")


def _reader(ds: Any, keys: list[str], pool: BufferPool | None, table: Any = None) -> TedReader:
    fields = ds.manifest.fields
    return TedReader(
        fields, Episodes(LENGTHS, table=table), ds.column, resolve_keys(fields, keys, ds.name), pool
    )


@pytest.mark.parametrize(
    "keys",
    [
        None,  # every key: next/done from the flags read
        ["next/done", "observation"],  # next/done read from the flags alone
        ["action", "next/reward"],  # no episode needed
        ["next/observation", "episode"],
    ],
)
@pytest.mark.parametrize("table", [None, np.int64, np.int32])
def test_the_array_plan_reads_what_the_general_loop_reads(dataset: Any, keys: Any, table: Any) -> None:
    keys = keys or list(dataset.fields)
    fast = _reader(dataset, keys, None, table)
    general = _reader(dataset, keys, BufferPool(min_bytes=0), table)  # every output pooled: the loop
    assert fast._array_plan is not None
    rng = np.random.default_rng(0)
    for shape in [(64,), (4, 8), (1,)]:
        idx = rng.integers(0, dataset.num_steps, shape)
        a, b = fast.gather(idx), general.gather(idx)
        assert list(a) == list(b) and sorted(a) == sorted(keys)  # next/done last in both
        for key in keys:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            np.testing.assert_array_equal(a[key], b[key])
