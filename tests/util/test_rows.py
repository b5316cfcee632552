"""rows_equal: row-wise exact equality (NaN equal to NaN) by bytes, with values where bytes differ."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli._util import rows as rows_module
from rlds_cli._util.rows import insert_rows, rows_equal


def _by_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The statement, one row at a time."""
    out = []
    for x, y in zip(a.reshape(len(a), -1), b.reshape(len(b), -1), strict=True):
        both_nan = np.isnan(x) & np.isnan(y) if x.dtype.kind in "fc" else np.zeros(x.shape, bool)
        out.append(bool(np.all((x == y) | both_nan)))
    return np.array(out, bool)


@pytest.mark.parametrize("dtype", ["uint8", "int16", ">i4", "float32", ">f8", "float16", "complex64", "bool"])
@pytest.mark.parametrize("row_shape", [(3, 5, 7), (8,), (1,), (6, 2)])
def test_rows_equal_matches_the_row_at_a_time_statement(dtype: str, row_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(row_shape))
    a = (rng.random((40, *row_shape)) * 4).astype(dtype)
    b = a.copy()
    flat = b.reshape(40, -1)
    flat[3, 0] = flat[3, 0] + 1 if dtype != "bool" else not flat[3, 0]  # one value changed
    flat[7, -1] = flat[7, -1] + 1 if dtype != "bool" else not flat[7, -1]
    np.testing.assert_array_equal(rows_equal(a, b), _by_values(a, b))
    assert not rows_equal(a, b)[3] and rows_equal(a, b)[0]


def test_floats_equal_by_value_whose_bytes_differ() -> None:
    a = np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 2.0], [np.nan, 3.0]], np.float32)
    b = a.copy()
    b[0, 0] = -0.0  # -0.0 == 0.0, other bytes
    b[1, 0] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]  # a NaN, other payload
    b[2, 1] = 2.5  # a real difference
    np.testing.assert_array_equal(rows_equal(a, b), [True, True, False, True])


def test_complex_nan_and_mixed_dtypes_compare_by_value() -> None:
    a = np.array([[complex(np.nan, 0)], [1 + 2j]], np.complex128)
    np.testing.assert_array_equal(rows_equal(a, a.copy()), [True, True])
    ints = np.array([[1, 2], [3, 4]], np.int64)
    np.testing.assert_array_equal(rows_equal(ints, np.array([[1, 2], [3, 5]], np.float64)), [True, False])


def test_empty_blocks_and_empty_rows() -> None:
    assert rows_equal(np.zeros((0, 3, 4), np.uint8), np.zeros((0, 3, 4), np.uint8)).shape == (0,)
    np.testing.assert_array_equal(rows_equal(np.zeros((2, 0)), np.zeros((2, 0))), [True, True])


def test_non_contiguous_rows() -> None:
    base = np.arange(60, dtype=np.uint8).reshape(5, 12)
    a, b = base[:, ::2], base.copy()[:, ::2]
    b[2, 1] = 0
    np.testing.assert_array_equal(rows_equal(a, b), [True, True, False, True, True])


def test_structured_rows_whose_bytes_differ_compare_by_value() -> None:
    kind = np.dtype([("x", "<f4"), ("n", "<i2")])
    a = np.array([[(0.0, 1)], [(1.5, 2)]], kind)
    b = a.copy()
    b["x"][0, 0] = -0.0  # other bytes, an equal value
    b["n"][1, 0] = 3
    np.testing.assert_array_equal(rows_equal(a, b), [True, False])


@pytest.mark.parametrize("chunk_words", [1 << 16, 12, 7])
@pytest.mark.parametrize("changed", [0, 1, 39, 40])
def test_rows_equal_with_few_and_many_rows_differing(
    changed: int, chunk_words: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # few differing words are listed one by one; more than one per row take the per-row path;
    # the block is compared in chunks of whole rows (here one chunk, 2 rows, 1 row)
    monkeypatch.setattr(rows_module, "_CHUNK_WORDS", chunk_words)
    a = np.arange(40 * 6, dtype=np.int32).reshape(40, 6)
    b = a.copy()
    b[:changed] += 1  # every word of the first `changed` rows
    np.testing.assert_array_equal(rows_equal(a, b), np.arange(40) >= changed)


@pytest.mark.parametrize(
    ("rows", "ends"),
    [
        (10, []),
        (10, [0]),
        (10, [4, 9]),
        (10, [9]),
        (10, list(range(10))),
        (1000, list(range(99, 1000, 100))),
        (1000, list(range(1000))),  # an end at every row: np.insert itself; the others copy slices
    ],
)
def test_insert_rows_is_np_insert(rows: int, ends: list[int]) -> None:
    rng = np.random.default_rng(rows)
    block = rng.random((rows, 3, 2)).astype(np.float32)
    at = np.array(ends, np.int64)
    finals = rng.random((len(at), 3, 2))  # float64: cast to the rows' dtype, as np.insert does
    got = insert_rows(block, at, finals)
    want = np.insert(block, at + 1, finals, axis=0)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_two_views_of_the_same_bytes_are_equal_without_a_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded episode's observation and next/observation are views of one array: the rows
    the continuity check compares are the same bytes, and are not read."""
    frames = np.random.default_rng(0).integers(0, 255, (9, 4, 4), dtype=np.uint8)
    obs, next_obs = frames[:-1], frames[1:]

    def read(*args: object) -> np.ndarray:
        raise AssertionError("the rows were read")

    monkeypatch.setattr(rows_module, "_bytes_equal", read)
    assert rows_equal(next_obs[:-1], obs[1:]).all()
    # the same bytes seen another way, or other bytes, are read: other rows, other strides
    for a, b in (
        (frames[:-1], frames[1:]),
        (frames.reshape(9, 2, 8)[:, :, ::2], frames.reshape(9, 2, 8)[:, :, :4]),
        (frames[:, :2], frames[:, ::2]),
    ):
        with pytest.raises(AssertionError, match="the rows were read"):
            rows_equal(a, b)
