"""The contract every storage backend keeps: a base class of tests to subclass.

Subclass and implement :meth:`BackendContract.backend`; one test per promise of
:class:`rlds_cli.cache.backends.Backend`: columns appended in any sizes read back exactly by every
kind of index; a missing file is reported by ``check_column``; a key that is no safe path is
refused before any write; a preallocated column written region by region, in any order, equals
the appended one file for file; a region that could share a file with another is refused."""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.backends import Backend
from rlds_cli.errors import CorruptDatasetError, InvalidKeyError

#: (key, dtype, row shape): a scalar column, float vectors, bools, pixel frames, a nested key.
COLUMNS = (
    ("next/reward", np.float32, ()),
    ("observation", np.float32, (17,)),
    ("next/terminated", np.bool_, (1,)),
    ("pixels", np.uint8, (3, 8, 8)),
    ("info/deep/counter", np.int64, (2,)),
)
ROWS = 203
#: Appends of uneven sizes, one empty, so no chunk or shard edge lines up with one.
APPENDS = (1, 0, 50, 7, 100, 45)


def column_values(dtype: type, shape: tuple[int, ...], rows: int = ROWS) -> np.ndarray:
    # a seed that is the same in every process (hash() of a str is not)
    rng = np.random.default_rng(zlib.crc32(repr((np.dtype(dtype).str, shape)).encode()))
    if np.dtype(dtype) == np.bool_:
        return rng.random((rows, *shape)) < 0.3
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((rows, *shape)).astype(dtype)
    return rng.integers(0, 200, (rows, *shape)).astype(dtype)


class BackendContract:
    """Tests every backend passes; subclasses implement :meth:`backend`."""

    def backend(self) -> Backend:
        raise NotImplementedError

    def write(self, where: Path, key: str, values: np.ndarray) -> None:
        writer = self.backend().create_column(where, key, values.dtype, values.shape[1:])
        start = 0
        for n in APPENDS:
            writer.append(values[start : start + n])
            start += n
        assert start == len(values)
        assert writer.close(fsync=False) == len(values)

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_a_column_reads_back_exactly(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        self.write(tmp_path, key, values)
        column = self.backend().open_column(tmp_path, key)
        assert len(column) == ROWS and tuple(column.shape) == values.shape
        assert np.dtype(column.dtype) == values.dtype
        np.testing.assert_array_equal(np.asarray(column[:]), values)
        for sl in (slice(0, 1), slice(49, 58), slice(ROWS - 3, None), slice(2, ROWS, 9), slice(7, 7)):
            np.testing.assert_array_equal(np.asarray(column[sl]), values[sl], err_msg=str(sl))
        idx = np.array([[ROWS - 1, 0, 51], [51, 50, 100]])
        np.testing.assert_array_equal(np.asarray(column[idx]), values[idx])
        assert self.backend().check_column(tmp_path, key, ROWS, shape) is None

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_read_column_reads_the_first_rows_into_ram(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        self.write(tmp_path, key, values)
        for stop in (ROWS, 51, 0):
            rows = self.backend().read_column(tmp_path, key, stop)
            assert isinstance(rows, np.ndarray) and not isinstance(rows, np.memmap)
            np.testing.assert_array_equal(rows, values[:stop])

    def test_read_column_of_a_missing_column_is_corrupt(self, tmp_path: Path) -> None:
        with pytest.raises(CorruptDatasetError):
            self.backend().read_column(tmp_path, "observation", 1)

    def test_a_missing_file_is_reported_by_check_column(self, tmp_path: Path) -> None:
        values = column_values(np.uint8, (3, 8, 8))
        self.write(tmp_path, "pixels", values)
        arrays = (tmp_path / "arrays").rglob("*")
        files = sorted(p for p in arrays if p.is_file() and p.name != "zarr.json")
        assert files
        files[-1].unlink()
        problem = self.backend().check_column(tmp_path, "pixels", ROWS, (3, 8, 8))
        if problem is None:  # a backend may only find it on reading, but then it must say so
            with pytest.raises(CorruptDatasetError):
                np.asarray(self.backend().open_column(tmp_path, "pixels")[:])
        else:
            assert "pixels" in problem or str(tmp_path) in problem

    def test_a_wrong_row_count_is_reported(self, tmp_path: Path) -> None:
        self.write(tmp_path, "observation", column_values(np.float32, (17,)))
        assert self.backend().check_column(tmp_path, "observation", ROWS + 1, (17,)) is not None

    @pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/./b", "sp ace", ""])
    def test_a_key_that_is_no_safe_path_is_refused_before_any_write(self, tmp_path: Path, key: str) -> None:
        with pytest.raises(InvalidKeyError):
            self.backend().create_column(tmp_path / "ds", key, np.dtype(np.float32), ())
        assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a refused key wrote a file"

    # ------------------------------------------------------------------ regions

    def regions(self, dtype: type, shape: tuple[int, ...], rows: int = ROWS) -> list[tuple[int, int]]:
        """Aligned regions covering ``rows``, of uneven sizes where the alignment allows."""
        align = self.backend().region_rows(np.dtype(dtype), shape)
        assert align >= 1
        cuts = sorted({0, rows, *(c for c in (align, 3 * align, 4 * align, 10 * align) if c < rows)})
        return list(itertools.pairwise(cuts))

    @pytest.mark.parametrize(("key", "dtype", "shape"), COLUMNS)
    def test_regions_in_any_order_equal_an_appended_column_file_for_file(
        self, tmp_path: Path, key: str, dtype: type, shape: tuple[int, ...]
    ) -> None:
        values = column_values(dtype, shape)
        backend = self.backend()
        backend.preallocate(tmp_path / "regions", key, np.dtype(dtype), shape, ROWS)
        assert backend.check_preallocated(tmp_path / "regions", key, ROWS, shape) is None
        for start, stop in reversed(self.regions(dtype, shape)):
            region = backend.open_region(tmp_path / "regions", key, start, stop)
            assert region.rows.shape == (stop - start, *shape)
            region.rows[:] = values[start:stop]
            region.close(fsync=True)
        assert backend.check_column(tmp_path / "regions", key, ROWS, shape) is None
        np.testing.assert_array_equal(np.asarray(backend.open_column(tmp_path / "regions", key)[:]), values)
        self.write(tmp_path / "appended", key, values)
        files = {
            p.relative_to(tmp_path / "appended"): p.read_bytes()
            for p in sorted((tmp_path / "appended").rglob("*"))
            if p.is_file()
        }
        assert files
        for rel, data in files.items():
            assert (tmp_path / "regions" / rel).read_bytes() == data, rel

    def test_regions_of_zeros_write_every_file(self, tmp_path: Path) -> None:
        """A region equal to the fill value is stored too: a missing file reads as damage."""
        values = np.zeros((ROWS, 1), np.bool_)
        backend = self.backend()
        backend.preallocate(tmp_path / "regions", "done", values.dtype, (1,), ROWS)
        for start, stop in self.regions(np.bool_, (1,)):
            region = backend.open_region(tmp_path / "regions", "done", start, stop)
            region.rows[:] = values[start:stop]
            region.close(fsync=False)
        assert backend.check_column(tmp_path / "regions", "done", ROWS, (1,)) is None
        self.write(tmp_path / "appended", "done", values)
        for path in (tmp_path / "appended").rglob("*"):
            if path.is_file():
                rel = path.relative_to(tmp_path / "appended")
                assert (tmp_path / "regions" / rel).read_bytes() == path.read_bytes(), rel

    def test_a_preallocated_column_of_another_size_is_reported(self, tmp_path: Path) -> None:
        self.backend().preallocate(tmp_path, "observation", np.dtype(np.float32), (17,), ROWS)
        assert self.backend().check_preallocated(tmp_path, "observation", ROWS + 1, (17,)) is not None
        assert self.backend().check_preallocated(tmp_path, "action", ROWS, (17,)) is not None

    def test_a_region_outside_the_column_or_off_its_alignment_is_refused(self, tmp_path: Path) -> None:
        backend = self.backend()
        backend.preallocate(tmp_path, "pixels", np.dtype(np.uint8), (3, 8, 8), ROWS)
        with pytest.raises(ValueError, match="outside"):
            backend.open_region(tmp_path, "pixels", 0, ROWS + 1)
        align = backend.region_rows(np.dtype(np.uint8), (3, 8, 8))
        if align > 1 and align + 1 < ROWS:
            with pytest.raises(ValueError, match="aligned"):
                backend.open_region(tmp_path, "pixels", 1, ROWS)
            with pytest.raises(ValueError, match="aligned"):
                backend.open_region(tmp_path, "pixels", 0, align + 1)
