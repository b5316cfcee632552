"""The parquet rows of a LeRobot dataset: read in order, one batch in memory, and turned into
numeric arrays of the shapes ``info.json`` declares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.lerobot.layout import INFO_FILE


def column_array(pa: Any, column: Any, shape: tuple[int, ...], where: Path, name: str) -> np.ndarray:
    """One parquet column as ``[rows, *shape]`` numbers (nested lists flattened; ``(1,)``
    features, which lerobot stores as scalars, get their axis back)."""
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    rows = len(values)
    if values.null_count:
        raise SourceFormatError(f"{where}: column {name!r} has {values.null_count} missing (null) values")
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        if not pa.types.is_fixed_size_list(values.type):
            lengths = values.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != lengths[0]).any():
                raise SourceFormatError(f"{where}: column {name!r} holds lists of different lengths (ragged)")
        values = values.flatten()
        if values.null_count:
            raise SourceFormatError(f"{where}: column {name!r} has missing (null) values inside its lists")
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        raise SourceFormatError(
            f"{where}: column {name!r} holds {values.type} values; rlds stores numeric arrays only "
            "(bool, integers, floats)"
        )
    flat = values.to_numpy(zero_copy_only=False)
    per_row = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if flat.size != rows * per_row:
        raise SourceFormatError(
            f"{where}: column {name!r} has {flat.size // max(rows, 1)} values per row, but "
            f"{INFO_FILE.as_posix()} declares the shape {list(shape)}"
        )
    return flat.reshape(rows, *(shape or (1,)))


class ParquetCursor:
    """Reads a data file's rows in order, one batch at a time (memory: one batch)."""

    def __init__(self, pa: Any, pq: Any, columns: list[str], block_rows: int) -> None:
        """Read ``columns`` (those a file lacks are left out), ``block_rows`` rows a batch."""
        self.pa = pa
        self.pq = pq
        self.columns = columns
        self.block_rows = block_rows
        self.path: Path | None = None
        self.batches: Iterator[Any] | None = None
        self.buffer: Any = None
        self.pos = 0  # file row of self.buffer's first row
        self.file: Any = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = self.batches = self.buffer = self.path = None

    def _open(self, path: Path) -> None:
        self.close()
        pq = self.pq
        columns = self.columns
        try:
            self.file = pq.ParquetFile(path)
            names = set(self.file.schema_arrow.names)
            self.batches = iter(
                self.file.iter_batches(
                    batch_size=self.block_rows,
                    columns=[c for c in dict.fromkeys(columns) if c in names],
                )
            )
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None
        self.path, self.pos, self.buffer = path, 0, None

    def read(self, path: Path, offset: int, count: int) -> Any:
        """Rows ``offset .. offset + count`` of ``path`` as a pyarrow table."""
        pa = self.pa
        if path != self.path or offset < self.pos:
            self._open(path)
        parts: list[Any] = []
        need_from, need_to = offset, offset + count
        while need_from < need_to:
            if self.buffer is None or self.pos + self.buffer.num_rows <= need_from:
                if self.buffer is not None:
                    self.pos += self.buffer.num_rows
                try:
                    assert self.batches is not None
                    self.buffer = next(self.batches)
                except StopIteration:
                    raise SourceFormatError(f"{path} ends at row {self.pos}, before row {need_to}") from None
                except (OSError, ValueError, pa.ArrowException) as exc:
                    raise SourceFormatError(f"{path} is damaged near row {self.pos}: {exc}") from None
                continue
            lo = need_from - self.pos
            take = min(self.buffer.num_rows - lo, need_to - need_from)
            parts.append(self.buffer.slice(lo, take))
            need_from += take
        return pa.Table.from_batches(parts) if parts else None
