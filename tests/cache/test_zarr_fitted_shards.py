"""A zarr column smaller than one shard is stored as one shard of just its chunks: a shard's
index has an entry for every chunk it could hold, so a full-size shard made the zarr copy of the
demo larger than the memmap one (16 KiB of index for each 5,000-row column)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlds_cli import open_dataset
from rlds_cli.cache.backends import (
    get_backend,
    zarr_chunk_rows,
    zarr_fitted_shard_rows,
    zarr_shard_rows,
)
from rlds_cli.cache.backends.zarr import write as backends
from rlds_cli.sources.download import download


def _file_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_fitted_shard_rows() -> None:
    dtype, row = np.dtype(np.float32), (2,)
    chunk, full = zarr_chunk_rows(dtype, row), zarr_shard_rows(dtype, row)
    assert full > chunk > 1
    assert zarr_fitted_shard_rows(dtype, row, 0) == full  # not known yet: a whole shard
    assert zarr_fitted_shard_rows(dtype, row, 1) == chunk
    assert zarr_fitted_shard_rows(dtype, row, chunk + 1) == 2 * chunk
    assert zarr_fitted_shard_rows(dtype, row, full - 1) == full
    assert zarr_fitted_shard_rows(dtype, row, full) == full
    assert zarr_fitted_shard_rows(dtype, row, 10 * full) == full  # many shards: full ones


def test_fitted_shard_rows_without_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "ZARR_SHARD_BYTES", 0)  # one file per chunk: nothing to fit
    assert zarr_fitted_shard_rows(np.dtype(np.float32), (2,), 10) == 0


def test_demo_in_zarr_is_one_fitted_shard_a_column_and_smaller_than_memmap(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backends, "ZARR_IN_RAM_BYTES", 0)  # the columns as their chunk readers
    memmap = open_dataset(download("demo").manifest.name)
    zarr = open_dataset(download("demo", name="demo-zarr", backend="zarr").manifest.name)
    for key in zarr.manifest.fields:
        column = zarr.column(key)
        reader = column._reader
        assert reader is not None
        rows = len(column)
        chunks = -(-rows // reader.chunk_rows)
        assert reader.per_shard == chunks, key  # an index entry per chunk it holds, no more
        shards = [p for p in (zarr.directory / "arrays" / key / "c").rglob("*") if p.is_file()]
        assert len(shards) == 1, key
        np.testing.assert_array_equal(np.asarray(column), np.asarray(memmap.column(key)), err_msg=key)
    # the README's claim: the zarr copy of the demo is the smaller one (file bytes)
    assert _file_bytes(zarr.directory) < _file_bytes(memmap.directory)


def test_a_preallocated_column_gets_the_same_fitted_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column written region by region (preallocated at its final size, as a per-step
    preprocess job writes) is the same files as the same rows appended."""
    monkeypatch.setattr(backends, "ZARR_IN_RAM_BYTES", 0)  # the column as its chunk reader
    backend = get_backend("zarr")
    rows = np.arange(3000 * 3, dtype=np.float32).reshape(3000, 3)
    appended, preallocated = tmp_path / "a", tmp_path / "b"
    writer = backend.create_column(appended, "x", rows.dtype, (3,))
    writer.append(rows[:1000])
    writer.append(rows[1000:])
    assert writer.close(fsync=False) == 3000
    backend.preallocate(preallocated, "x", rows.dtype, (3,), 3000)
    region = backend.open_region(preallocated, "x", 0, 3000)
    region.rows[:] = rows
    region.close(fsync=False)
    files = sorted(p.relative_to(appended) for p in appended.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(preallocated) for p in preallocated.rglob("*") if p.is_file())
    for name in files:
        assert (appended / name).read_bytes() == (preallocated / name).read_bytes(), name
    column = backend.open_column(appended, "x")
    np.testing.assert_array_equal(np.asarray(column[np.arange(3000)]), rows)
    assert (
        column._array.shards[0]
        == zarr_fitted_shard_rows(rows.dtype, (3,), 3000)
        < zarr_shard_rows(rows.dtype, (3,))
    )
